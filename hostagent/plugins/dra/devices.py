"""Which devices the DRA plugin publishes, pure: the agent's device views in, the pool's
devices out, named and described as NVIDIA's DRA driver names and describes them, so its
DeviceClasses and the CEL selectors written for it select them unchanged.

- A GPU without MIG is ``gpu-<minor>``, ``type: gpu``; with NVLink peers, ``nvlinkGroup``
  names the GPUs it is fully linked with (``nvlink_groups``), for ``matchAttribute``. MIG
  devices have none: a MIG device has no peer-to-peer access.
- A MIG device is ``gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>``
  (``1g.5gb+me`` spelled ``1g5gb-me``; a compute instance smaller than its GPU instance adds
  ``-c<its start>``), ``type: mig``.
- With dynamic MIG, a GPU in MIG mode also offers every GPU-instance profile at every
  placement its free memory slices allow (KEP 4815): each such partition consumes the GPU's
  counters (``memory-slice-<i>`` for each memory slice it covers, its ``compute-slices``,
  and its multiprocessors, engines and memory, as NVIDIA's driver counts them), so the
  scheduler never hands out two that overlap, or more than the GPU can hold together. MIG
  devices made otherwise (``mig apply``) are published as themselves, the partitions that
  overlap them are not offered, and the counters are what they leave; a device made for a
  claim is published as the partition it was made from (with its health), so preparing a
  claim changes nothing in the pool.

Each ``Published`` device carries how the agent allocates it: an existing device by UUID,
a partition as the MIG device to create at its placement.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace

from ... import model
from .quantity import format_quantity as quantity

__all__ = ["Published", "CounterSet", "Pool", "build_pool", "gpu_name", "mig_name", "profile_label",
           "counter_set_name", "semver", "nvlink_groups", "vfio_name", "whole_set_name", "WHOLE", "WHOLE_VALUE"]

COUNTER_SUFFIX = "-counter-set"
STANDARD = "resource.kubernetes.io"
ARCHITECTURES = {"ada": "Ada Lovelace"}       # NVIDIA's spelling where title case is not it


@dataclass(frozen=True)
class Published:
    name: str                             # the device's name in the pool (a DNS label)
    kind: str                             # "gpu", "mig" (an existing MIG device) or "partition"
    gpu: str                              # the UUID of its GPU (itself for a GPU)
    health_of: str                        # the agent UUID whose health it has
    attributes: dict                      # qualified name -> {"string"|"int"|"version"|"bool": value}
    capacity: dict                        # qualified name -> {"value": quantity}
    allocate: dict                        # the agent's allocation item for it
    consumes: dict | None = None          # {"counterSet": name, "counters": {name: {"value": q}}}
    uuid: str | None = None               # None: a partition (its MIG device made when prepared)
    # With passthrough: what it takes of its GPU's whole-GPU counter set, which the GPU, its
    # partitions and its vfio device share (so the scheduler never gives the GPU both ways).
    shares: dict | None = None
    taints: tuple = ()                    # its DeviceTaints from the agent's health (taints.py)

    def resource(self) -> dict:
        """As a ResourceSlice lists it."""
        out = {"name": self.name, "attributes": self.attributes}
        if self.capacity:
            out["capacity"] = self.capacity
        consumed = [c for c in (self.consumes, self.shares) if c]
        if consumed:
            out["consumesCounters"] = consumed
        if self.taints:
            out["taints"] = [dict(t) for t in self.taints]
        return out

    @property
    def counter_sets(self) -> tuple[str, ...]:
        return tuple(c["counterSet"] for c in (self.shares, self.consumes) if c)


@dataclass(frozen=True)
class CounterSet:
    name: str
    counters: dict                        # counter name -> {"value": quantity}

    def resource(self) -> dict:
        return {"name": self.name, "counters": self.counters}


@dataclass(frozen=True)
class Pool:
    devices: tuple[Published, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()
    problems: tuple[str, ...] = field(default=())

    @functools.cached_property
    def by_name(self) -> dict[str, Published]:
        return {d.name: d for d in self.devices}


# ---- names and values ------------------------------------------------------------------

def profile_label(profile: str) -> str:
    """``1g.5gb+me`` -> ``1g5gb-me``: lower case, no dots, anything else not a DNS label
    character a hyphen (NVIDIA's canonical MIG profile name)."""
    return re.sub(r"[^a-z0-9-]", "-", profile.lower().replace(".", ""))


def gpu_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_name(parent_minor: int, profile: str, gi_profile_id: int, start: int, ci_start: int | None = None) -> str:
    name = f"gpu-{parent_minor}-mig-{profile_label(profile)}-{gi_profile_id}-{start}"
    return name if ci_start is None else f"{name}-c{ci_start}"


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}{COUNTER_SUFFIX}"


def semver(text: str | None) -> str | None:
    """A dotted version as semantic version 2.0.0: three numbers without leading zeros
    (``550.54.15`` stays, ``535.104.05`` is ``535.104.5``, ``8.0`` is ``8.0.0``); None when
    it is not one."""
    if not text:
        return None
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(numbers)


def _string(v) -> dict:
    return {"string": str(v)[:64]}


def _int(v) -> dict:
    return {"int": int(v)}


def _architecture(text: str | None) -> str:
    text = text or "unknown"
    return ARCHITECTURES.get(text, text[:1].upper() + text[1:])


# ---- attributes --------------------------------------------------------------------------

def _common(gpu: dict, node: dict) -> dict:
    """What a GPU and its MIG devices share: product, versions, PCI and NUMA placement."""
    out = {"productName": _string(gpu["product"]), "architecture": _string(_architecture(gpu.get("architecture")))}
    if gpu.get("brand"):
        out["brand"] = _string(gpu["brand"])
    for attr, value in (("cudaComputeCapability", gpu.get("compute_capability")),
                        ("driverVersion", node.get("driver_version")),
                        ("cudaDriverVersion", node.get("cuda_driver_version"))):
        version = semver(value)
        if version:
            out[attr] = {"version": version}
    if gpu.get("pci_bus_id"):
        out[f"{STANDARD}/pciBusID"] = _string(_sysfs_bus_id(gpu["pci_bus_id"]))
    if gpu.get("pcie_root"):
        out[f"{STANDARD}/pcieRoot"] = _string(gpu["pcie_root"])
    if gpu.get("numa_node") is not None:
        out[f"{STANDARD}/numaNode"] = _int(gpu["numa_node"])
    return out


def _sysfs_bus_id(bus_id: str) -> str:
    """``00000000:07:00.0`` (NVML) -> ``0000:07:00.0`` (sysfs, as Kubernetes' deviceattribute package publishes it)."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:]}:{rest}" if rest else bus_id.lower()


def _mig_capacity(memory_mib: int, multiprocessors: int, engines: dict) -> dict:
    values = {"multiprocessors": multiprocessors, "copyEngines": engines.get("copy", 0),
              "decoders": engines.get("decoder", 0), "encoders": engines.get("encoder", 0),
              "jpegEngines": engines.get("jpeg", 0), "ofaEngines": engines.get("ofa", 0),
              "memory": memory_mib * 2 ** 20}
    return {k: {"value": quantity(v)} for k, v in values.items()}


def nvlink_groups(gpus: list[dict]) -> dict[str, str]:
    """GPU uuid -> its NVLink group: the uuid of the group's first GPU. A group is GPUs each
    joined to every other by NVLink (directly or through NVSwitches), taken in index order:
    each GPU not yet in one starts a group, which the later GPUs linked to all its members
    join (DGX-1's hybrid cube mesh makes 0-3 and 4-7; an NVSwitch system one group). A GPU
    linked to none of ``gpus``, or whose topology is unknown, is in none (the caller leaves
    out GPUs in MIG mode: they have no peer-to-peer access)."""
    links: dict[str, set[str]] = {}
    for g in gpus:
        peers = (g.get("topology") or {}).get("peers") or ()
        links[g["uuid"]] = {p["uuid"] for p in peers if p.get("nvlinks")}
    out: dict[str, str] = {}
    for g in gpus:
        first = g["uuid"]
        if first in out or not links[first]:
            continue
        group = [first]
        for h in gpus:
            u = h["uuid"]
            if u not in out and u not in group and all(u in links[m] and m in links[u] for m in group):
                group.append(u)
        if len(group) > 1:
            out.update(dict.fromkeys(group, first))
    return out


def _gpu(gpu: dict, node: dict, nvlink_group: str | None = None) -> Published:
    attributes = {"type": _string("gpu"), "uuid": _string(gpu["uuid"]), **_common(gpu, node),
                  "index": _int(gpu["index"]), "minor": _int(gpu["minor"])}
    if nvlink_group:
        attributes["nvlinkGroup"] = _string(nvlink_group)
    capacity = {"memory": {"value": quantity(gpu["memory_mib"] * 2 ** 20)}} if gpu.get("memory_mib") else {}
    return Published(gpu_name(gpu["minor"]), "gpu", gpu["uuid"], gpu["uuid"], attributes, capacity,
                     {"device": gpu["uuid"]}, uuid=gpu["uuid"])


def _mig_attributes(gpu: dict, node: dict, profile: str, uuid: str | None) -> dict:
    out = {"type": _string("mig"), "profile": _string(profile), "parentUUID": _string(gpu["uuid"]),
           "parentIndex": _int(gpu["index"]), "parentMinor": _int(gpu["minor"]), **_common(gpu, node)}
    if uuid:
        out["uuid"] = _string(uuid)
    return out


def _gi_profile(profile: str) -> str:
    """The GPU-instance profile of a MIG device's profile (``1c.2g.10gb`` -> ``2g.10gb``)."""
    return re.sub(r"^\d+c\.", "", profile)


def _existing_mig(mig: dict, gpu: dict, node: dict) -> Published:
    partial = _gi_profile(mig["profile"]) != mig["profile"]
    name = mig_name(gpu["minor"], mig["profile"], mig["gi_profile_id"], mig["placement"]["start"],
                    mig["ci_placement"]["start"] if partial else None)
    capacity = _mig_capacity(mig["memory_mib"], mig["multiprocessors"], mig.get("engines") or {})
    # One memorySlice<i> capacity for each memory slice of its GPU instance's placement, as
    # NVIDIA's MigDeviceInfo.GetDevice publishes beside the engines.
    start, size = mig["placement"]["start"], mig["placement"]["size"]
    capacity.update({f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)})
    return Published(name, "mig", gpu["uuid"], mig["uuid"], _mig_attributes(gpu, node, mig["profile"], mig["uuid"]),
                     capacity, {"device": mig["uuid"]}, uuid=mig["uuid"])


# The counters a partition draws on, as NVIDIA's driver names them (its capacities, in DNS
# label spelling), each the most any profile of the GPU has; plus one per memory slice, and
# the compute slices.
COUNTED = (("multiprocessors", "multiprocessors"), ("copyEngines", "copy-engines"), ("decoders", "decoders"),
           ("encoders", "encoders"), ("jpegEngines", "jpeg-engines"), ("ofaEngines", "ofa-engines"),
           ("memory", "memory"))


def _usage(capacity: dict, slices: int) -> dict[str, int]:
    """What a partition (or a MIG device) of these capacities uses of its GPU's counters."""
    from .quantity import parse_quantity
    out = {counter: parse_quantity(capacity[cap]["value"]) for cap, counter in COUNTED}
    out["compute-slices"] = slices
    return out


def _partition(gpu: dict, node: dict, p: dict, start: int, size: int, made: str | None = None) -> Published:
    """A partition of ``gpu``; ``made``: the MIG device made from it for a claim (whose
    health it has then; its GPU's before)."""
    name = mig_name(gpu["minor"], p["name"], p["id"], start)
    capacity = _mig_capacity(p["memory_mib"], p["multiprocessors"], p.get("engines") or {})
    counters = {k: {"value": quantity(v)} for k, v in _usage(capacity, p["slices"]).items()}
    counters.update({f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)})
    return Published(name, "partition", gpu["uuid"], made or gpu["uuid"], _mig_attributes(gpu, node, p["name"], None),
                     capacity, {"mig": {"gpu": gpu["uuid"], "profile": p["name"], "start": start}},
                     consumes={"counterSet": counter_set_name(gpu["minor"]), "counters": counters})


def _slices(profiles: list[dict]) -> tuple[int, int]:
    """(memory slices, compute slices) of a GPU, from its profiles' placements and sizes."""
    memory = max((pl["start"] + pl["size"] for p in profiles for pl in p["placements"]), default=0)
    return memory, max((p["slices"] for p in profiles), default=0)


def _dynamic(gpu: dict, node: dict, profiles: list[dict], migs: list[dict], made: dict[str, tuple]) -> tuple[
        list[Published], CounterSet | None]:
    """A MIG-mode GPU under dynamic MIG: its MIG devices not made for claims, then every
    partition in the slices they leave free, and the counter set the partitions draw on
    (what the GPU has, less what those MIG devices use)."""
    static = [m for m in migs if m["uuid"] not in made]
    out = [_existing_mig(m, gpu, node) for m in static]
    totals = {counter: 0 for _, counter in COUNTED}
    for p in profiles:
        usage = _usage(_mig_capacity(p["memory_mib"], p["multiprocessors"], p.get("engines") or {}), p["slices"])
        for counter in totals:
            totals[counter] = max(totals[counter], usage[counter])
    memory, compute = _slices(profiles)
    totals["compute-slices"] = compute
    used: set[int] = set()
    instances = set()
    for m in static:
        used.update(range(m["placement"]["start"], m["placement"]["start"] + m["placement"]["size"]))
        key = (m["placement"]["start"], m["gi_profile_id"])
        info = next((p for p in profiles if p["id"] == key[1]), None)
        if key in instances or info is None:
            continue                  # several compute instances of one GPU instance count once
        instances.add(key)
        usage = _usage(_mig_capacity(info["memory_mib"], info["multiprocessors"], info.get("engines") or {}),
                       info["slices"])
        for counter in totals:
            totals[counter] = max(0, totals[counter] - usage[counter])
    free = [i for i in range(memory) if i not in used]
    if not free or not totals["compute-slices"]:
        return out, None
    made_here = {(profile, start): uuid for uuid, (parent, profile, start) in made.items() if parent == gpu["uuid"]}
    for p in profiles:
        for pl in p["placements"]:
            if not used.intersection(range(pl["start"], pl["start"] + pl["size"])):
                out.append(_partition(gpu, node, p, pl["start"], pl["size"], made_here.get((p["name"], pl["start"]))))
    counters = {k: {"value": quantity(v)} for k, v in totals.items()}
    counters.update({f"memory-slice-{i}": {"value": "1"} for i in free})
    return out, CounterSet(counter_set_name(gpu["minor"]), counters)


# ---- passthrough (NVIDIA's vfio devices) ------------------------------------------------

WHOLE = "whole-gpu"      # the counter of a GPU's whole-GPU set
WHOLE_VALUE = 8          # the GPU and its vfio device take all of it, a partition 1 (at most 7 a GPU)


def vfio_name(index: int) -> str:
    return f"gpu-vfio-{index}"


def whole_set_name(index: int) -> str:
    """The whole-GPU counter set of the GPU at ``index`` on the PCI bus: named by the bus,
    not the NVML minor, so it stays while the GPU is passed through (out of NVML)."""
    return f"{vfio_name(index)}{COUNTER_SUFFIX}"


def _vfio_uuid(bdf: str) -> str:
    """NVIDIA's vfio device uuid: a UUIDv5 (SHA-1, DNS namespace) of the PCI address."""
    import uuid as uuidlib
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, bdf))


def _vfio(gpu: dict, iommufd: bool) -> Published:
    """NVIDIA's vfio device of a GPU on the bus (``node["vfio"]["gpus"]``): its name,
    attributes and capacity as NVIDIA's driver gives them (``VfioDeviceInfo.GetDevice``)."""
    attributes = {"type": _string("vfio"), "uuid": _string(_vfio_uuid(gpu["pci_bus_id"])),
                  "deviceID": _string(f"0x{int(gpu['device_id'], 16):04x}"),
                  "vendorID": _string(f"0x{int(gpu.get('vendor_id') or '0x10de', 16):04x}"),
                  "numa": _int(gpu["numa_node"] if gpu.get("numa_node") is not None else -1),
                  "productName": _string(gpu.get("product") or gpu["device_id"]),
                  "iommuFDEnabled": {"bool": bool(iommufd)},
                  f"{STANDARD}/pciBusID": _string(gpu["pci_bus_id"])}
    if gpu.get("pcie_root"):
        attributes[f"{STANDARD}/pcieRoot"] = _string(gpu["pcie_root"])
    capacity = {"addressableMemory": {"value": quantity(gpu.get("addressable_memory") or 0)}}
    return Published(vfio_name(gpu["index"]), "vfio", gpu.get("uuid") or gpu["pci_bus_id"],
                     gpu.get("uuid") or gpu["pci_bus_id"], attributes, capacity,
                     {"passthrough": {"gpu": gpu["pci_bus_id"]}}, uuid=gpu.get("uuid"),
                     shares=_take(gpu["index"], WHOLE_VALUE))


def _take(index: int, value: int) -> dict:
    return {"counterSet": whole_set_name(index), "counters": {WHOLE: {"value": str(value)}}}


def _with_passthrough(published: list[Published], vfio: dict, node: dict) -> tuple[list[Published], list[CounterSet]]:
    """Each GPU on the bus also as its vfio device, and every device of a GPU drawing on its
    whole-GPU counter set: the GPU and the vfio device all of it, a partition one; a GPU with
    MIG devices made otherwise has no vfio device (as NVIDIA's driver offers none)."""
    # A GPU without an IOMMU group has no vfio device, so no whole-GPU set to draw on.
    by_uuid = {g["uuid"]: g for g in vfio.get("gpus") or () if g.get("uuid") and g.get("iommu_group") is not None}
    static = {d.gpu for d in published if d.kind == "mig"}
    out, sets = [], []
    for d in published:
        g = by_uuid.get(d.gpu)
        if g is None or d.gpu in static:
            out.append(d)
            continue
        out.append(replace(d, shares=_take(g["index"], 1 if d.kind == "partition" else WHOLE_VALUE)))
    for g in vfio.get("gpus") or ():
        if g.get("uuid") in static or g.get("iommu_group") is None:
            continue
        out.append(_vfio(g, vfio.get("iommufd", False)))
        sets.append(CounterSet(whole_set_name(g["index"]), {WHOLE: {"value": str(WHOLE_VALUE)}}))
    return out, sets


def build_pool(devices: dict[str, dict], profiles: dict[str, list[dict]], node: dict, dynamic_mig: bool = False,
               made: dict[str, tuple] | None = None, passthrough: bool = False) -> Pool:
    """The pool's devices. ``devices``: uuid -> the agent's device view; ``profiles``: GPU
    uuid -> its MIG profile views; ``node``: the agent's node view; ``made``: MIG device
    uuid -> (GPU uuid, profile, placement start) of the devices made for claims (they stand as
    their partitions); ``passthrough``: each GPU also as NVIDIA's vfio device (where the
    IOMMU is on). GPUs first, in index order, each followed by its MIG devices; the vfio
    devices last."""
    made = made or {}
    gpus = sorted((d for d in devices.values() if d["kind"] == "gpu"), key=lambda d: d["index"])
    migs: dict[str, list[dict]] = {}
    for d in devices.values():
        if d["kind"] == "mig":
            migs.setdefault(d["parent_uuid"], []).append(d)
    published: list[Published] = []
    counter_sets: list[CounterSet] = []
    problems: list[str] = []
    groups = nvlink_groups([g for g in gpus if not model.mig_enabled(g)])
    for gpu in gpus:
        children = sorted(migs.get(gpu["uuid"], ()),
                          key=lambda m: (m["placement"]["start"], m["ci_placement"]["start"]))
        if not model.mig_enabled(gpu):
            published.append(_gpu(gpu, node, groups.get(gpu["uuid"])))
            continue
        gpu_profiles = profiles.get(gpu["uuid"]) or []
        if dynamic_mig and gpu_profiles:
            found, counters = _dynamic(gpu, node, gpu_profiles, children, made)
            published += found
            if counters is not None:
                counter_sets.append(counters)
            continue
        if dynamic_mig:
            problems.append(f"GPU {gpu['index']}: its MIG profiles are unknown, no partitions offered")
        published += [_existing_mig(m, gpu, node) for m in children]
    vfio = node.get("vfio") or {}
    if passthrough and vfio.get("iommu"):
        published, whole = _with_passthrough(published, vfio, node)
        counter_sets += whole
    elif passthrough:
        problems.append("no vfio devices offered: the IOMMU is off" if vfio else
                        "no vfio devices offered: the agent does not report the PCI bus (an older agent?)")
    names: dict[str, str] = {}
    unique = []
    for d in published:
        if d.name in names:
            problems.append(f"device {d.name} is named twice ({names[d.name]}, {d.health_of}): the second left out")
            continue
        names[d.name] = d.health_of
        unique.append(d)
    return Pool(tuple(unique), tuple(counter_sets), tuple(problems))
