"""The node's current MIG state as a v1 config (mig-parted's ``export``): GPUs with the
same state share one entry, ``devices: all`` where an entry covers every GPU (of its SKU,
on a mixed node, where entries carry a ``device-filter``)."""

from __future__ import annotations

from ..devices.records import Inventory
from .layout import Layout
from .spec import ConfigEntry, DeviceFilter, MigSpec

__all__ = ["export_spec"]


def export_spec(inventory: Inventory, label: str = "current") -> MigSpec:
    mixed = len({g.pci_device_id for g in inventory.gpus}) > 1
    groups: dict[tuple, list[int]] = {}
    for gpu in inventory.gpus:
        layout = Layout.of(gpu)
        enabled = gpu.mig is not None and layout.enabled
        devices = tuple(sorted(layout.counts().items())) if enabled else ()
        key = (gpu.pci_device_id if mixed else None, enabled, devices)
        groups.setdefault(key, []).append(gpu.index)
    entries = []
    for (device_id, enabled, devices), indices in groups.items():
        same_kind = [g.index for g in inventory.gpus if device_id is None or g.pci_device_id == device_id]
        which = "all" if indices == same_kind else tuple(indices)
        entries.append(ConfigEntry(which, enabled, devices,
                                   (DeviceFilter(device_id),) if device_id is not None else ()))
    return MigSpec({label: tuple(entries)}, "<export>")
