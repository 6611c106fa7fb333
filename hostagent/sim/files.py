"""Files of the simulated driver root that change while the node runs."""

from __future__ import annotations

import functools
import os
import re
import stat
from pathlib import Path

from ..errors import PermissionDenied
from ..fileio import ensure_dir, write_atomic
from .node import NodeFacts, NodeState

__all__ = ["NodeFiles", "can_create_device_nodes", "recorded_char_device", "mig_minors", "mig_cap_names",
           "sync_mig_caps", "create_cap_nodes", "remove_cap_nodes", "add_drm_nodes", "FIXED_CAP_MINORS"]

KERNEL_RELEASE = "6.1.0-28-amd64"           # Debian 12's kernel


def release(root: Path) -> str:
    """The running kernel's release (``/proc/sys/kernel/osrelease``)."""
    try:
        return (root / "proc/sys/kernel/osrelease").read_text().strip() or KERNEL_RELEASE
    except OSError:
        return KERNEL_RELEASE


# nvidia-cap1 (mig/config, root only) and nvidia-cap2 (mig/monitor) exist whatever the
# instances: minor -> mode of the /dev node.
FIXED_CAP_MINORS = {1: 0o400, 2: 0o444}
DRM_MAJOR = 226
# What stands in for a character device on a node made by a user who may not create device
# nodes: a regular file recording the device's numbers (recorded_char_device reads them).
_RECORD = "simulated character device {major}:{minor}\n"
_RECORDED = re.compile(r"simulated character device (\d+):(\d+)\n")


def can_create_device_nodes(directory: Path) -> bool:
    """Whether this process may create character devices in ``directory``.

    Root is not enough: a user namespace (``unshare -r``), a rootless container or a
    dropped CAP_MKNOD all refuse mknod with EPERM, so one harmless node is tried.
    """
    if os.geteuid() != 0:
        return False
    probe = directory / f".mknod-probe-{os.getpid()}"
    try:
        os.mknod(probe, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        return False
    probe.unlink()
    return True


@functools.cache
def mig_minors() -> dict[str, int]:
    """The driver's fixed table of MIG capability minors (all 32 possible GPUs)."""
    table = {"config": 1, "monitor": 2}
    for g in range(32):
        for i in range(15):
            base = 3 + 135 * g + 9 * i
            table[f"gpu{g}/gi{i}/access"] = base
            for c in range(8):
                table[f"gpu{g}/gi{i}/ci{c}/access"] = base + 1 + c
    return table


class NodeFiles:
    """Creates files under the root; device nodes are real when we may mknod."""

    def __init__(self, root: Path, real_nodes: bool):
        self.root = root
        self.real_nodes = real_nodes

    def file(self, rel: str, text: str | bytes, mode: int = 0o644) -> Path:
        path = self.root / rel
        ensure_dir(path.parent)
        write_atomic(path, text, mode=mode, durable=False)   # simulated files: see SimStore.mutate
        return path

    def link(self, rel: str, target: str) -> None:
        path = self.root / rel
        ensure_dir(path.parent)
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(target)

    def chardev(self, rel: str, major: int, minor: int, mode: int = 0o666) -> None:
        path = self.root / rel
        ensure_dir(path.parent)
        if path.exists() or path.is_symlink():
            path.unlink()
        if self.real_nodes:
            try:
                os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
            except PermissionError:
                raise PermissionDenied(
                    "no permission to create device nodes, and this simulated node has real ones",
                    where=str(path), hint="run as root with CAP_MKNOD, outside a user namespace, "
                    "or recreate the node there ('hostagent sim create --force') to get regular "
                    "files") from None
            os.chmod(path, mode)
        else:
            write_atomic(path, _RECORD.format(major=major, minor=minor), mode=mode, durable=False)


def recorded_char_device(path):
    """The device a regular file the simulator wrote in place of a device node stands for
    (``hostagent.platform.CharDevice``), or None when the file is no such record."""
    from ..platform import CharDevice
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        found = _RECORDED.fullmatch(os.read(fd, 64).decode("ascii", "replace"))
    finally:
        os.close(fd)
    return CharDevice(int(found[1]), int(found[2]), stat.S_IMODE(st.st_mode)) if found else None


def mig_cap_names(state: NodeState) -> dict[str, int]:
    """The capabilities the driver lists for the instances that exist: name -> minor."""
    minors = mig_minors()
    want: dict[str, int] = {}
    for gpu in state.gpus:
        for gi in gpu.gis:
            want[f"gpu{gpu.minor}/gi{gi.id}/access"] = minors[f"gpu{gpu.minor}/gi{gi.id}/access"]
            for ci in gi.cis:
                name = f"gpu{gpu.minor}/gi{gi.id}/ci{ci.id}/access"
                want[name] = minors[name]
    return want


def sync_mig_caps(root: Path, facts: NodeFacts, state: NodeState,
                  before: dict[str, int] | None = None) -> None:
    """Make the /proc capability files match the instances that exist, as the driver does.

    With ``before`` (the capabilities of the state this one was changed from) only the
    difference is written; without, the whole tree is scanned. The driver cannot create
    ``/dev/nvidia-caps`` nodes; nvidia-smi and hostagent's MIG manager do
    (``create_cap_nodes``), and stale nodes stay until someone removes them.
    """
    w = NodeFiles(root, facts.real_device_nodes)
    want = mig_cap_names(state)
    caps_dir = root / "proc/driver/nvidia/capabilities"

    def proc_path(name: str) -> Path:
        gpu_part, rest = name.split("/", 1)
        return caps_dir / gpu_part / "mig" / rest

    if before is None:
        stale = []
        for path in caps_dir.glob("gpu*/mig/**/access"):
            rel = path.relative_to(caps_dir).as_posix().replace("/mig/", "/", 1)
            if rel not in want:
                stale.append(path)
    else:
        stale = [proc_path(name) for name in before if name not in want]
    for path in sorted(stale, reverse=True):         # CIs before their GI
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        parent = path.parent
        while parent.name != "mig" and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    for name, minor in want.items():
        if before is not None and name in before:
            continue
        proc = proc_path(name)
        if not proc.exists():
            w.file(proc.relative_to(root).as_posix(),
                   f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n", mode=0o444)


def create_cap_nodes(root: Path, facts: NodeFacts) -> list[int]:
    """Create the /dev node of every capability /proc lists (what ``nvidia-modprobe -f`` does
    for each); returns the minors created."""
    w = NodeFiles(root, facts.real_device_nodes)
    created = []
    for proc in sorted((root / "proc/driver/nvidia/capabilities").glob("gpu*/mig/**/access")):
        minor = int(proc.read_text().split("DeviceFileMinor:")[1].split()[0])
        node = root / f"dev/nvidia-caps/nvidia-cap{minor}"
        if not (node.exists() or node.is_symlink()):
            w.chardev(node.relative_to(root).as_posix(), facts.majors["nvidia-caps"], minor, 0o444)
            created.append(minor)
    return created


def remove_cap_nodes(root: Path) -> None:
    """Remove the instance capability nodes (all but config's and monitor's), as a reboot
    does: /dev starts empty and only the fixed nodes are made again at boot."""
    for node in (root / "dev/nvidia-caps").glob("nvidia-cap*"):
        minor = node.name.removeprefix("nvidia-cap")
        if minor.isdigit() and int(minor) not in FIXED_CAP_MINORS:
            node.unlink(missing_ok=True)


def add_drm_nodes(root: Path, facts: NodeFacts, pci_bus_id: str, card: int) -> tuple[str, str]:
    """Give the GPU at ``pci_bus_id`` (sysfs form) the DRM nodes a display-capable GPU has
    with nvidia-drm loaded: sysfs ``drm/card<N>`` and ``drm/renderD<128+N>`` entries and the
    /dev/dri nodes of the same names. Returns those names."""
    w = NodeFiles(root, facts.real_device_nodes)
    names = (f"card{card}", f"renderD{128 + card}")
    for name, minor in zip(names, (card, 128 + card)):
        ensure_dir(root / f"sys/bus/pci/devices/{pci_bus_id}/drm/{name}")
        w.chardev(f"dev/dri/{name}", DRM_MAJOR, minor, 0o660)
    return names
