"""``/dev/nvidia-caps/nvidia-cap<N>`` nodes for the MIG instances that exist.

The driver publishes each instance's capability minor but cannot create the device node
(nvidia-modprobe or nvidia-smi does, on real hosts); containers need the GI and CI nodes
to use a MIG device. After a layout change this creates the nodes of new instances and
removes those of instances that are gone, touching only per-instance minors (never
``config``/``monitor``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ..devices.records import Inventory
from ..driver.nvcaps import CAPS_MAJOR_NAME, ci_cap, gi_cap, read_char_majors, read_mig_minors
from ..errors import NotFoundError
from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot

__all__ = ["CapNodeChange", "sync_cap_nodes", "wanted_minors"]

_PREFIX = "nvidia-cap"


@dataclass(frozen=True)
class CapNodeChange:
    created: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()


def wanted_minors(inventory: Inventory, minors: dict[str, int]) -> set[int]:
    out = set()
    for gpu in inventory.gpus:
        if not gpu.mig_enabled:
            continue
        for gi in gpu.mig.gpu_instances:
            out.add(minors[gi_cap(gpu.minor, gi.id)])
            out.update(minors[ci_cap(gpu.minor, gi.id, ci.id)] for ci in gi.compute_instances)
    return out


def _instance_minors(minors: dict[str, int]) -> set[int]:
    return {m for name, m in minors.items() if name.startswith("gpu") and "/gi" in name}


def _proc_modes(host: HostRoot) -> dict[int, int]:
    """Each existing instance's node mode, from its /proc capability file (DeviceFileMinor,
    DeviceFileMode), as nvidia-modprobe reads it."""
    modes = {}
    for path in host.proc("driver/nvidia/capabilities").glob("gpu*/mig/**/access"):
        fields = {}
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
            modes[int(fields["DeviceFileMinor"])] = int(fields["DeviceFileMode"]) & 0o777
        except (OSError, KeyError, ValueError):
            continue
    return modes


def _real_nodes(directory) -> bool:
    """Character devices, unless this root's existing nodes are regular files (a simulated
    node built without root), in which case new ones are made the same way."""
    for probe in (directory / f"{_PREFIX}1", directory.parent / "nvidiactl"):
        try:
            return not stat.S_ISREG(os.lstat(probe).st_mode)
        except FileNotFoundError:
            continue
    return True


def sync_cap_nodes(host: HostRoot, inventory: Inventory) -> CapNodeChange:
    minors = read_mig_minors(host)
    major = read_char_majors(host).get(CAPS_MAJOR_NAME)
    if major is None:
        raise NotFoundError(f"no '{CAPS_MAJOR_NAME}' character device in /proc/devices",
                            where=str(host.proc("devices")), hint="is the NVIDIA driver loaded?")
    directory = ensure_dir(host.dev("nvidia-caps"), 0o755)
    want = wanted_minors(inventory, minors)
    managed = _instance_minors(minors)
    have = set()
    for entry in os.listdir(directory):
        if entry.startswith(_PREFIX) and entry[len(_PREFIX):].isdigit():
            have.add(int(entry[len(_PREFIX):]))
    removed = sorted((have & managed) - want)
    for minor in removed:
        try:
            os.unlink(directory / f"{_PREFIX}{minor}")
        except FileNotFoundError:
            pass
    created = sorted(want - have)
    real = _real_nodes(directory)
    modes = _proc_modes(host) if created else {}
    for minor in created:
        path = directory / f"{_PREFIX}{minor}"
        mode = modes.get(minor, 0o444)
        if real:
            os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
            os.chmod(path, mode)      # mknod applies the umask
        else:
            write_atomic(path, f"simulated character device {major}:{minor}\n", mode=mode, durable=False)
    return CapNodeChange(tuple(created), tuple(removed))
