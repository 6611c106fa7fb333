"""Which processes have a simulated node's GPUs open through NVML.

nvml.h: ``nvmlInit_v2`` initialises no GPU ("GPUs are discovered and initialized in
nvmlDeviceGetHandleBy* functions instead"); a ``nvmlDeviceGetHandleByIndex``,
``ByUUID`` or ``ByPciBusId`` "causes NVML to initialize the target GPU", which opens its
device node (``/dev/nvidia<minor>``: the nvidia driver counts each open in the GPU's
``usage_count``, ``nv.c``); ``nvmlShutdown`` releases "all GPU resources previously
allocated", once the last of the process's ``nvmlInit`` calls is matched ("Shutdown only
occurs when the reference count reaches zero"). While the count is not zero the driver
refuses the GPU's unbind lock (``nv-procfs.c``) and a removal waits for it (``nv-pci.c``);
nvml.h's ``nvmlDeviceRemoveGpu_v2`` names the same rule ("as long as no other processes are
attached").

Each GPU a process holds is an empty file ``.sim/nvml/<pid>-<start>-<bus id>``: made when
its handle is first taken (one ``open``, no content to be seen half-written), removed at
the process's last ``nvmlShutdown``. The process's start time in the name makes a reused
pid name nobody; the kernel closes a dead process's files, so a file whose process is gone
holds nothing (and is removed when seen). A process that cannot write the folder (another
user's node) is not recorded.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["attach", "detach", "holders"]

log = logging.getLogger(__name__)

FOLDER = "nvml"
_me: dict = {}           # pid -> this process's start time (taken once)


def _folder(root) -> Path:
    from .store import SIM_DIR
    return Path(root) / SIM_DIR / FOLDER


def _start(pid: int) -> int | None:
    """The process's start time (clock ticks after boot: ``/proc/<pid>/stat``'s 22nd
    field), None when it is gone or a zombie. Read from the file, importing nothing: a
    process that dropped its privileges may not be able to import any more."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        return None if fields[0] == b"Z" else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _prefix() -> str | None:
    pid = os.getpid()
    if pid not in _me:
        _me.clear()
        _me[pid] = _start(pid)
    return None if _me[pid] is None else f"{pid}-{_me[pid]}-"


def attach(store, bdf: str) -> None:
    """This process holds the GPU at ``bdf`` open."""
    prefix = _prefix()
    if prefix is None:
        return
    folder = _folder(store.root)
    try:
        folder.mkdir(mode=0o755, exist_ok=True)
        os.close(os.open(folder / f"{prefix}{bdf}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644))
    except OSError as e:
        log.debug("simulated NVML: %s held open, not recorded: %s", bdf, e)


def detach(store) -> None:
    """This process holds nothing open any more (its last nvmlShutdown)."""
    prefix = _prefix()
    folder = _folder(store.root)
    try:
        names = [n for n in os.listdir(folder) if prefix and n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        try:
            os.unlink(folder / name)
        except OSError:
            pass


def holders(root, bdf: str) -> list[int]:
    """The live processes holding the GPU at ``bdf`` open through NVML."""
    folder = _folder(root)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out, starts = set(), {}
    for name in names:
        pid, _, rest = name.partition("-")
        start, _, held = rest.partition("-")
        if not (pid.isdigit() and start.isdigit()):
            continue
        if int(pid) not in starts:
            starts[int(pid)] = _start(int(pid))
        if starts[int(pid)] != int(start):
            try:
                os.unlink(folder / name)      # the kernel closed its files when it ended
            except OSError:
                pass
            continue
        if held == bdf:
            out.add(int(pid))
    return sorted(out)
