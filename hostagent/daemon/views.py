"""The API's JSON shapes of devices, the node and allocations, from inventory records.

Pure: records in, plain dicts out. The device view carries everything a device plugin's
ListAndWatch or a DRA driver's ResourceSlice needs (identity, PCI address, product,
architecture, compute capability, memory, MIG placement and engines), plus the device's
CDI names, health and the allocations using it.
"""

from __future__ import annotations

from ..devices import Gpu, Inventory, MigDevice, MigProfile

__all__ = ["gpu_view", "mig_view", "profile_view", "device_views", "allocation_view", "with_device_marks"]


def profile_view(p: MigProfile) -> dict:
    return {"name": p.name, "id": p.id, "slices": p.slices, "memory_mib": p.memory_mib,
            "instances": p.instances, "multiprocessors": p.multiprocessors,
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


def device_views(inventory: Inventory | None, cdi_names: dict[str, tuple[str, ...]],
                 health: dict, users: dict[str, list[tuple[str, str]]], default_health,
                 sharing: dict[str, dict] | None = None) -> dict[str, dict]:
    """uuid -> view (without its revision), GPUs then MIG devices, in index order.

    A device is allocatable when the node spec describes it (a GPU with MIG enabled is
    used through its MIG devices, and a device missing its nodes is left out of the spec)
    and it is not unhealthy. ``sharing``: uuid -> how it is shared (``GET /v1/sharing``'s
    device entries); its ``replicas`` are the ids a device plugin advertises for it.
    """
    sharing = sharing or {}
    out: dict[str, dict] = {}
    if inventory is None:
        return out
    migs = []
    for gpu in inventory.gpus:
        out[gpu.uuid] = gpu_view(gpu)
        migs += [(d, gpu) for d in (gpu.mig.devices if gpu.mig else ())]
    for dev, parent in migs:
        out[dev.uuid] = mig_view(dev, parent)
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
    return out


def allocation_view(alloc) -> dict:
    return {"id": alloc.id, "devices": list(alloc.devices), "cdi_devices": list(alloc.cdi_devices),
            "spec_path": alloc.spec_path, "sharing": alloc.sharing, "replicas": list(alloc.replicas),
            "labels": alloc.request.get("labels", {}), "request": alloc.request,
            "created": round(alloc.created, 3), "container_edits": alloc.container_edits,
            "visible_devices": ",".join(alloc.devices)}


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
