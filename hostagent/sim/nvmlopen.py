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

Each process with GPUs attached keeps one file, ``.sim/nvml/<pid>.json``: its identity
(pid, start time, executable, so a reused pid names nobody) and the PCI bus ids it
attached. The kernel closes a dead process's files, so a file whose process is gone holds
nothing (and is removed when seen). A process that cannot write the folder (another user's
node) is not recorded.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

__all__ = ["attach", "detach", "holders"]

log = logging.getLogger(__name__)

FOLDER = "nvml"
_me: dict = {}           # pid -> this process's ProcessRecord (taken once)


def _folder(store) -> Path:
    return store.dir / FOLDER


def _record():
    from ..processes import record
    pid = os.getpid()
    if pid not in _me:
        _me.clear()
        _me[pid] = record(pid)
    return _me[pid]


def attach(store, bdfs) -> None:
    """This process holds ``bdfs`` open (all it holds, replacing what was recorded)."""
    from ..fileio import ensure_dir, write_atomic
    me = _record()
    if me is None:
        return
    try:
        ensure_dir(_folder(store), 0o755)
        write_atomic(_folder(store) / f"{me.pid}.json",
                     json.dumps({"process": me.to_dict(), "gpus": sorted(bdfs)}), mode=0o644, durable=False)
    except OSError as e:
        log.debug("simulated NVML: attachment not recorded: %s", e)


def detach(store) -> None:
    """This process holds nothing open any more (its last nvmlShutdown)."""
    try:
        os.unlink(_folder(store) / f"{os.getpid()}.json")
    except OSError:
        pass


def holders(root, bdf: str) -> list[int]:
    """The live processes holding the GPU at ``bdf`` open through NVML."""
    from ..processes import ProcessRecord, current
    from .store import SIM_DIR
    folder = Path(root) / SIM_DIR / FOLDER
    out = []
    for path in (folder.iterdir() if folder.is_dir() else ()):
        try:
            raw = json.loads(path.read_text())
            proc = ProcessRecord.from_dict(raw["process"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not current(proc):
            try:
                path.unlink()             # the kernel closed its files when it ended
            except OSError:
                pass
            continue
        if bdf in raw.get("gpus", ()):
            out.append(proc.pid)
    return sorted(out)
