"""The one device model: a GPU, a MIG device, the node and an allocation as JSON, the
components ``Gpu``, ``MigDevice``, ``Node`` and ``Allocation`` of ``api/openapi.json``.

Every reader speaks it: ``hostagent devices|node -o json|yaml``, ``GET /v1/devices`` and
``/v1/node``, the watch stream's events, ``hostagent.client`` and the kubelet plugins. Pure:
inventory records (plus, for the daemon, its own facts) in, plain dicts out.

What only the daemon knows about a device (``DAEMON_FIELDS``: its CDI names, allocations,
sharing, replicas, revision) is added by the daemon to the inventory's part and is absent
from the CLI's output without a daemon; no field is ever renamed between the two. Health is
the daemon's too: ``{"state": "unknown"}`` where none answers.

To add a fact: read it into the inventory's record (``hostagent.devices.records``), render
it here under one name, and describe it in the component of ``openapi.json`` as an optional
property (older readers ignore it). The agreement test renders every simulated profile
through both paths and validates both against the components.
"""

from __future__ import annotations

__all__ = ["UNKNOWN_HEALTH", "DAEMON_FIELDS", "placement", "mig_mode", "mig_profile", "gpu_place", "gpu",
           "mig_device", "inventory_devices", "device", "daemon_device", "device_list", "unreadable", "unread",
           "node", "allocation", "mig_layout", "mig_enabled", "pci_id"]

UNKNOWN_HEALTH = {"state": "unknown"}

# A device's fields that only a running daemon has (never renamed, only absent without it).
DAEMON_FIELDS = ("cdi_devices", "allocatable", "allocations", "sharing", "replicas", "revision", "made_for")


def pci_id(value: int) -> str:
    """A PCI device or subsystem id as nvidia-smi and mig-parted's device filters write it:
    ``0x20B010DE`` (device, then vendor)."""
    return f"0x{value:08X}"


def mig_mode(enabled: bool, pending: bool) -> dict:
    """A MIG mode as nvidia-smi shows it (``MIG M.``: current and pending):
    ``{"current": "enabled", "pending": "disabled"}``."""
    word = {True: "enabled", False: "disabled"}
    return {"current": word[enabled], "pending": word[pending]}


def mig_enabled(view: dict) -> bool:
    """Whether a GPU's document says MIG is enabled now (False without MIG)."""
    mig = view.get("mig")
    return bool(mig) and mig["mode"]["current"] == "enabled"


def placement(p) -> dict | None:
    return None if p is None else {"start": p.start, "size": p.size}


def _engines(r) -> dict:
    return {"copy": r.copy_engines, "decoder": r.decoders, "encoder": r.encoders,
            "jpeg": r.jpegs, "ofa": r.ofas}


def mig_profile(p) -> dict:
    """A GPU-instance profile (``MigProfile``)."""
    return {"name": p.name, "id": p.id, "index": p.index, "slices": p.slices,
            "memory_slices": p.memory_slices, "instances": p.instances, "memory_mib": p.memory_mib,
            "multiprocessors": p.multiprocessors, "engines": _engines(p),
            "placements": [placement(pl) for pl in p.placements]}


def _gpu_instance(gi) -> dict:
    return {"id": gi.id, "profile_id": gi.profile_id, "profile": gi.profile,
            "placement": placement(gi.placement),
            "compute_instances": [{"id": ci.id, "profile_id": ci.profile_id, "slices": ci.slices,
                                   "placement": placement(ci.placement)} for ci in gi.compute_instances]}


def gpu_place(place) -> dict:
    """What NVML says of where a GPU sits, from its ``devices.GpuTopology``: the CPUs and NUMA
    nodes near it, its NVLinks (how many lead to NVSwitches), why NVML could not place it."""
    return {"cpu_affinity": place.cpu_affinity, "numa_affinity": place.numa_affinity,
            "nvlinks": place.nvlinks, "nvswitch_links": place.nvswitch_links, "error": place.error}


def _topology(g, inventory) -> dict | None:
    """A GPU's ``GpuTopology``: its place and how it reaches every other GPU (None: the
    inventory's topology was not read)."""
    topology = inventory.topology if inventory is not None else None
    place = topology.gpu(g.index) if topology is not None else None
    if place is None:
        return None
    uuids = {other.index: other.uuid for other in inventory.gpus}
    return {**gpu_place(place), "peers": [
        {"index": other, "uuid": uuids[other], "link": link.code, "nvlinks": link.nvlinks, "pcie": link.pcie}
        for other, link in topology.peers(g.index)]}


def gpu(g, *, profiles: bool = False, inventory=None) -> dict:
    """The inventory's part of a GPU's document; with ``profiles``, its MIG profiles in
    ``mig.profiles``; ``inventory`` (the GPU's), its ``topology`` (else null)."""
    mig = None
    if g.mig is not None:
        mig = {"mode": mig_mode(g.mig.enabled, g.mig.pending),
               "devices": [d.uuid for d in g.mig.devices],
               "gpu_instances": [_gpu_instance(gi) for gi in g.mig.gpu_instances]}
        if profiles:
            mig["profiles"] = [mig_profile(p) for p in g.mig.profiles]
    return {"kind": "gpu", "name": str(g.index), "uuid": g.uuid, "index": g.index, "minor": g.minor,
            "product": g.name, "serial": g.serial, "memory_mib": g.memory_mib,
            "pci_bus_id": g.pci_bus_id, "pci_device_id": pci_id(g.pci_device_id),
            "pci_subsystem_id": pci_id(g.pci_subsystem_id), "numa_node": g.numa_node,
            "pcie_root": g.pcie_root, "topology": _topology(g, inventory),
            "compute_capability": g.compute_capability, "architecture": g.architecture,
            "brand": g.brand, "mig_capable": g.mig is not None, "mig": mig}


def mig_device(d, parent) -> dict:
    """The inventory's part of a MIG device's document (``parent``: its GPU's record)."""
    return {"kind": "mig", "name": d.name, "uuid": d.uuid, "index": d.index,
            "parent_index": d.parent_index, "parent_uuid": d.parent_uuid, "parent_minor": d.parent_minor,
            "product": parent.name, "profile": d.profile, "gi": d.gi, "ci": d.ci,
            "gi_profile_id": d.gi_profile_id, "ci_profile_id": d.ci_profile_id,
            "placement": placement(d.placement), "ci_placement": placement(d.ci_placement),
            "memory_mib": d.memory_mib, "multiprocessors": d.multiprocessors, "engines": _engines(d),
            "numa_node": parent.numa_node, "pcie_root": parent.pcie_root,
            "compute_capability": parent.compute_capability, "architecture": parent.architecture}


def inventory_devices(inventory, *, profiles: bool = False) -> dict[str, dict]:
    """uuid -> the inventory's part of each device's document: GPUs, then MIG devices, in
    index order."""
    out: dict[str, dict] = {}
    migs = []
    for g in inventory.gpus:
        out[g.uuid] = gpu(g, profiles=profiles, inventory=inventory)
        migs += [(d, g) for d in (g.mig.devices if g.mig else ())]
    for d, parent in migs:
        out[d.uuid] = mig_device(d, parent)
    return out


def device(part: dict, health: dict) -> dict:
    """A device's document without a daemon: the inventory's ``part`` and its ``health``."""
    out = part.copy()
    out["health"] = health
    return out


def daemon_device(part: dict, health: dict, cdi_devices: list, allocatable: bool, allocations: list,
                  sharing: dict | None, replicas: list) -> dict:
    """A device's document as the daemon serves it: with the ``DAEMON_FIELDS`` it knows
    (``revision`` is added as it is published). Positional: it runs for every device at
    every publication."""
    out = part.copy()
    out["health"] = health
    out["cdi_devices"] = cdi_devices
    out["allocatable"] = allocatable
    out["allocations"] = allocations
    out["sharing"] = sharing
    out["replicas"] = replicas
    return out


def unreadable(u) -> dict:
    """A GPU NVML counts but cannot read."""
    return {"index": u.index, "error": u.error, "nvml_code": u.nvml_code}


def unread(u) -> dict:
    """A fact NVML refused the reading process (without privilege)."""
    return {"gpu": u.gpu, "what": u.what, "error": u.error}


def device_list(devices, inventory) -> dict:
    """``DeviceList`` (without the daemon's revision): ``devices`` are documents."""
    devices = list(devices)
    return {"gpus": [d for d in devices if d["kind"] == "gpu"],
            "mig_devices": [d for d in devices if d["kind"] == "mig"],
            "unreadable": [unreadable(u) for u in inventory.unreadable] if inventory else [],
            "unread": [unread(u) for u in inventory.unread] if inventory else []}


def node(inventory, *, hostname: str, simulated: bool) -> dict:
    """The inventory's part of ``Node`` (``inventory`` None: not read yet, or unreadable)."""
    inv = inventory
    return {"hostname": hostname,
            "driver_version": inv.driver_version if inv else None,
            "cuda_driver_version": inv.cuda_driver_version if inv else None,
            "nvml_version": inv.nvml_version if inv else None,
            "simulated": simulated,
            "device_nodes": inv.device_nodes if inv else None,
            "gpus": len(inv.gpus) if inv else 0,
            "mig_devices": len(inv.mig_devices) if inv else 0,
            "unreadable_gpus": len(inv.unreadable) if inv else 0,
            "paths": dict(inv.paths) if inv else {}}


def mig_layout(g, layout) -> dict:
    """A GPU's entry of ``MigState`` (``GET /v1/mig``, ``hostagent mig status``): ``layout``
    is its ``hostagent.mig.layout.Layout``, None without MIG."""
    return {"index": g.index, "uuid": g.uuid, "product": g.name,
            "mig": None if layout is None else {
                "mode": mig_mode(layout.enabled, layout.pending), "layout": layout.describe(),
                "devices": layout.counts(), "gpu_instances": layout.to_dict()["gpu_instances"]}}


def allocation(a) -> dict:
    """An allocation (``Allocation``) from the daemon's record."""
    return {"id": a.id, "devices": list(a.devices), "cdi_devices": list(a.cdi_devices),
            "spec_path": a.spec_path, "sharing": a.sharing, "replicas": list(a.replicas),
            "device_sharing": dict(a.device_sharing), "made": list(a.made), "mps": a.mps,
            "labels": a.request.get("labels", {}), "request": a.request,
            "created": round(a.created, 3), "owner": a.owner, "container_edits": a.container_edits,
            "visible_devices": ",".join(a.devices),
            **({"passthrough": [{k: v for k, v in r.items() if k != "id"} for r in a.passthrough]}
               if a.passthrough else {})}
