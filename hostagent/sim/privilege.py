"""Who the simulated driver serves: the privilege checks behind NVML's NO_PERMISSION.

nvml.h marks the MIG listing and placement calls "Requires privileged user", makes memory
and process queries on a MIG-enabled GPU aggregate "only if the caller has appropriate
privileges", and has SetMigMode "Requires root user". The MIG user guide ("Device Nodes and
Capabilities") says what the privileges are: CAP_SYS_ADMIN implicitly holds every
nvidia-capability; others need read access to the capability's device node, mig/config
(``nvidia-cap1``, mode 0400: root only by default) to create and destroy instances,
mig/monitor (``nvidia-cap2``, 0444) to see them ("Toggling MIG mode requires the
CAP_SYS_ADMIN capability"). The container toolkit's NVIDIA_MIG_MONITOR_DEVICES mounts that
node into containers, which otherwise get "Insufficient Permissions" for a MIG parent's
memory (k8s-device-plugin #399, #1683; container-toolkit #842).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["sys_admin", "can_monitor", "can_configure", "CONFIG_MINOR", "MONITOR_MINOR"]

CONFIG_MINOR, MONITOR_MINOR = 1, 2      # mig/config and mig/monitor in mig-minors
_CAP_SYS_ADMIN = 21
_by_euid: dict[int, bool] = {}


def sys_admin() -> bool:
    """Whether this process holds CAP_SYS_ADMIN (keyed by euid: dropping root drops it)."""
    euid = os.geteuid()
    if euid not in _by_euid:
        try:
            with open("/proc/self/status") as f:
                eff = next(line.split()[1] for line in f if line.startswith("CapEff:"))
            _by_euid[euid] = bool(int(eff, 16) >> _CAP_SYS_ADMIN & 1)
        except (OSError, StopIteration, ValueError):
            _by_euid[euid] = euid == 0
    return _by_euid[euid]


def _capability(root: Path, minor: int) -> bool:
    return sys_admin() or os.access(root / f"dev/nvidia-caps/nvidia-cap{minor}", os.R_OK)


def can_monitor(root: Path) -> bool:
    """List GPU and compute instances, read a MIG parent's aggregate memory and processes,
    receive events scoped to MIG instances."""
    return _capability(root, MONITOR_MINOR)


def can_configure(root: Path) -> bool:
    """Create and destroy GPU and compute instances."""
    return _capability(root, CONFIG_MINOR)
