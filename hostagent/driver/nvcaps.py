"""MIG capabilities: the driver's minor table, device majors, and capability node paths.

The driver publishes every possible capability and its minor in
``/proc/driver/nvidia-caps/mig-minors`` and a ``/proc/driver/nvidia/capabilities/...`` file
per existing instance, but cannot create ``/dev/nvidia-caps/nvidia-cap<N>`` itself;
whoever changes the MIG layout creates the nodes (as nvidia-smi and nvidia-modprobe do).
"""

from __future__ import annotations

from ..errors import NotFoundError
from ..hostroot import HostRoot

__all__ = ["read_mig_minors", "read_char_majors", "gi_cap", "ci_cap", "cap_node", "CAPS_MAJOR_NAME"]

CAPS_MAJOR_NAME = "nvidia-caps"


def read_mig_minors(host: HostRoot) -> dict[str, int]:
    """``{"gpu0/gi1/access": 12, ...}``; lines that do not parse are skipped, as the driver's
    other readers do."""
    path = host.proc("driver/nvidia-caps/mig-minors")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise NotFoundError("the driver publishes no MIG capability minors", where=str(path),
                            hint="is the NVIDIA driver loaded, and new enough for MIG (R450+)?") from None
    table = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 2 and parts[1].isdigit():
            table[parts[0]] = int(parts[1])
    return table


def read_char_majors(host: HostRoot) -> dict[str, int]:
    """Character-device majors by driver name, from ``/proc/devices``."""
    majors: dict[str, int] = {}
    section = None
    for line in host.proc("devices").read_text().splitlines():
        if line.endswith("devices:"):
            section = line
            continue
        parts = line.split()
        if section == "Character devices:" and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def gi_cap(gpu_minor: int, gi: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/access"


def ci_cap(gpu_minor: int, gi: int, ci: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"


def cap_node(host: HostRoot, minor: int):
    return host.dev(f"nvidia-caps/nvidia-cap{minor}")
