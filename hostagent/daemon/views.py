"""The API's JSON shapes of devices, the node and allocations, from inventory records.

Pure: records in, plain dicts out. The device view carries everything a device plugin's
ListAndWatch or a DRA driver's ResourceSlice needs (identity, PCI address, product,
architecture, compute capability, memory, MIG placement and engines), plus the device's
CDI names, health and the allocations using it.
"""

from __future__ import annotations

import json

from ..devices import Gpu, Inventory, MigDevice, MigProfile

__all__ = ["gpu_view", "mig_view", "profile_view", "device_views", "BaseViews", "allocation_view",
           "allocation_json", "with_device_marks"]


def profile_view(p: MigProfile) -> dict:
    return {"name": p.name, "id": p.id, "slices": p.slices, "memory_mib": p.memory_mib,
            "instances": p.instances, "multiprocessors": p.multiprocessors,
            "engines": {"copy": p.copy_engines, "decoders": p.decoders, "encoders": p.encoders,
                        "jpeg": p.jpegs, "ofa": p.ofas},
            "placements": [{"start": pl.start, "size": pl.size} for pl in p.placements]}


def gpu_view(gpu: Gpu) -> dict:
    mig = None
    if gpu.mig is not None:
        mig = {"capable": True, "enabled": gpu.mig.enabled, "pending": gpu.mig.pending,
               "devices": [d.uuid for d in gpu.mig.devices]}
    return {"kind": "gpu", "name": str(gpu.index), "uuid": gpu.uuid, "index": gpu.index,
            "minor": gpu.minor, "product": gpu.name, "serial": gpu.serial,
            "memory_mib": gpu.memory_mib, "pci_bus_id": gpu.pci_bus_id,
            "pci_device_id": f"0x{gpu.pci_device_id:08x}", "numa_node": gpu.numa_node,
            "compute_capability": gpu.compute_capability, "architecture": gpu.architecture,
            "mig": mig}


def mig_view(dev: MigDevice, parent: Gpu) -> dict:
    return {"kind": "mig", "name": dev.name, "uuid": dev.uuid, "index": dev.index,
            "parent_index": dev.parent_index, "parent_uuid": dev.parent_uuid,
            "product": parent.name, "profile": dev.profile, "gi": dev.gi, "ci": dev.ci,
            "placement": {"start": dev.placement.start, "size": dev.placement.size},
            "ci_placement": {"start": dev.ci_placement.start, "size": dev.ci_placement.size},
            "memory_mib": dev.memory_mib, "multiprocessors": dev.multiprocessors,
            "engines": {"copy": dev.copy_engines, "decoders": dev.decoders,
                        "encoders": dev.encoders, "jpeg": dev.jpegs, "ofa": dev.ofas},
            "compute_capability": parent.compute_capability, "architecture": parent.architecture}


def _inventory_views(inventory: Inventory) -> dict[str, dict]:
    """uuid -> the inventory's part of its view, GPUs then MIG devices, in index order."""
    out: dict[str, dict] = {}
    migs = []
    for gpu in inventory.gpus:
        out[gpu.uuid] = gpu_view(gpu)
        migs += [(d, gpu) for d in (gpu.mig.devices if gpu.mig else ())]
    for dev, parent in migs:
        out[dev.uuid] = mig_view(dev, parent)
    return out


class BaseViews:
    """The inventory's part of the device views, made once per inventory: every allocation
    and health change publishes the views again, and only their other fields change."""

    def __init__(self):
        self._inventory = None
        self._views: dict[str, dict] = {}

    def of(self, inventory: Inventory) -> dict[str, dict]:
        if inventory is not self._inventory:
            self._inventory, self._views = inventory, _inventory_views(inventory)
        return self._views


def device_views(inventory: Inventory | None, cdi_names: dict[str, tuple[str, ...]],
                 health: dict, users: dict[str, list[tuple[str, str]]], default_health,
                 sharing: dict[str, dict] | None = None, base: BaseViews | None = None,
                 made_for: dict[str, str] | None = None) -> dict[str, dict]:
    """uuid -> view (without its revision), GPUs then MIG devices, in index order.

    A device is allocatable when the node spec describes it (a GPU with MIG enabled is
    used through its MIG devices, and a device missing its nodes is left out of the spec)
    and it is not unhealthy. ``sharing``: uuid -> how it is shared (``GET /v1/sharing``'s
    device entries); its ``replicas`` are the ids a device plugin advertises for it.
    ``base``: where the inventory's part is kept between calls (each view is a copy of it).
    ``made_for``: MIG device uuid -> the allocation it was made for (``made_for`` of its view).
    """
    sharing = sharing or {}
    made_for = made_for or {}
    if inventory is None:
        return {}
    parts = base.of(inventory) if base is not None else _inventory_views(inventory)
    out = {uuid: dict(part) for uuid, part in parts.items()}
    for uuid, view in out.items():
        h = health.get(uuid) or default_health
        names = list(cdi_names.get(uuid, ()))
        view["cdi_devices"] = names
        view["health"] = h.to_dict()
        view["allocatable"] = bool(names) and h.allocatable
        view["allocations"] = sorted(a for a, _ in users.get(uuid, ()))
        shared = sharing.get(uuid)
        view["sharing"] = shared
        view["replicas"] = list(shared["replica_ids"]) if shared and names else [uuid] if names else []
        if view["kind"] == "mig":
            view["made_for"] = made_for.get(uuid)
    return out


def allocation_view(alloc) -> dict:
    return {"id": alloc.id, "devices": list(alloc.devices), "cdi_devices": list(alloc.cdi_devices),
            "spec_path": alloc.spec_path, "sharing": alloc.sharing, "replicas": list(alloc.replicas),
            "device_sharing": dict(alloc.device_sharing), "made": list(alloc.made),
            "labels": alloc.request.get("labels", {}), "request": alloc.request,
            "created": round(alloc.created, 3), "container_edits": alloc.container_edits,
            "visible_devices": ",".join(alloc.devices)}


# id -> (container edits, their JSON): an allocation's edits are most of its view (the
# driver's libraries and tools), and allocations of the same devices share one edits dict
# (see the allocator), so each is rendered once for every answer and event carrying it.
_EDITS_JSON: dict[int, tuple[dict, bytes]] = {}


def _edits_json(edits: dict) -> bytes:
    hit = _EDITS_JSON.get(id(edits))
    if hit is not None and hit[0] is edits:
        return hit[1]
    out = json.dumps(edits, separators=(",", ":")).encode()
    if len(_EDITS_JSON) >= 64:
        del _EDITS_JSON[next(iter(_EDITS_JSON))]          # the oldest
    _EDITS_JSON[id(edits)] = (edits, out)
    return out


def allocation_json(alloc, edits: bool = True) -> bytes:
    """``allocation_view(alloc)`` as compact JSON (its keys in another order); without its
    ``container_edits`` when not ``edits``."""
    view = allocation_view(alloc)
    container_edits = view.pop("container_edits")
    head = json.dumps(view, separators=(",", ":")).encode()
    if not edits:
        return head
    return head[:-1] + b',"container_edits":' + _edits_json(container_edits) + b"}"


def with_device_marks(view: dict, devices: dict[str, dict]) -> dict:
    """An allocation view with ``missing_devices`` (gone from the inventory) and
    ``unhealthy_devices`` (their health says so), each only when not empty."""
    missing = [u for u in view["devices"] if u not in devices]
    unhealthy = [u for u in view["devices"] if u in devices and devices[u]["health"]["state"] == "unhealthy"]
    if missing:
        view = {**view, "missing_devices": missing}
    if unhealthy:
        view = {**view, "unhealthy_devices": unhealthy}
    return view
