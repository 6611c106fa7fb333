"""Host facts GFD labels carry that NVML does not give: machine type and PCI class."""

from __future__ import annotations

from ..devices import Inventory
from ..hostroot import HostRoot

__all__ = ["machine_type", "gpu_mode"]

# PCI class codes: 0x0300xx VGA-compatible (graphics), 0x0302xx 3D controller (compute).
_MODES = {"0x0300": "graphics", "0x0302": "compute"}


def machine_type(host: HostRoot) -> str:
    try:
        return host.sys("class/dmi/id/product_name").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def gpu_mode(host: HostRoot, inv: Inventory) -> str:
    """The mode of the first GPU, as GFD reports it."""
    if not inv.gpus:
        return "unknown"
    try:
        cls = host.sys(f"bus/pci/devices/{inv.gpus[0].sysfs_bus_id}/class").read_text().strip()
    except OSError:
        return "unknown"
    return _MODES.get(cls[:6], "unknown")
