"""The sharing configuration against the node's devices: which device is shared how (pure).

``resolve(inventory, config)`` names every shared GPU and MIG device with its strategy,
replicas, resource name and settings, and what each GPU then needs (compute mode, time-slice
interval). Every input the node cannot honour is refused here, before anything changes, with
the resource entry it comes from: an unknown resource name or device, MPS on a GPU without
MPS support or with more replicas than its MPS client limit, MPS and time-slicing on one
device (or on two MIG devices of one GPU: they need different compute modes), a time-slice
interval on a MIG device, a pinned memory limit above the device's memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..devices import Gpu, Inventory, MigDevice
from ..errors import ConfigError
from .config import DOC, PREFIX, ResourceSpec, SharingConfig, StrategySpec

__all__ = ["DeviceSharing", "GpuSharing", "Desired", "resolve", "max_clients", "replica_ids",
           "MPS_MIN_CC", "EXCLUSIVE_PROCESS", "DEFAULT"]

# NVIDIA's MPS package description: "CUDA MPS requires a device that supports Unified
# Virtual Address (UVA) and has compute capability SM 3.5 or higher".
MPS_MIN_CC = (3, 5)
EXCLUSIVE_PROCESS, DEFAULT = "EXCLUSIVE_PROCESS", "DEFAULT"
GPU_RESOURCE = f"{PREFIX}/gpu"


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def max_clients(compute_capability: str) -> int:
    """MPS clients per device, as the device plugin's assertReplicas counts them: 48 from
    compute capability 7.5 (its comment says Volta; the comparison is against 7.5), else 16."""
    return 48 if _cc(compute_capability) >= (7, 5) else 16


def replica_ids(uuid: str, replicas: int) -> tuple[str, ...]:
    """The ids a device plugin advertises: ``<uuid>::<n>`` as it annotates replicas; a
    device with one replica is advertised as itself."""
    return (uuid,) if replicas <= 1 else tuple(f"{uuid}::{i}" for i in range(replicas))


@dataclass(frozen=True)
class DeviceSharing:
    """How one GPU or MIG device is shared."""
    uuid: str
    name: str                       # "3", or "0:1" for a MIG device
    kind: str                       # "gpu" or "mig"
    gpu_uuid: str                   # the physical GPU (itself for a GPU)
    gpu_index: int
    strategy: str                   # "mps" or "time-slicing"
    resource: str
    rename: str | None
    replicas: int
    fail_requests_greater_than_one: bool
    memory_mib: int
    where: str                      # the resource entry it comes from
    interval: str | None = None                     # time-slicing
    active_thread_percentage: int | None = None     # MPS, resolved (100/replicas by default)
    pinned_memory_limit_mib: int | None = None       # MPS, resolved (memory/replicas by default)

    @property
    def replica_ids(self) -> tuple[str, ...]:
        return replica_ids(self.uuid, self.replicas)

    @property
    def label(self) -> str:
        return f"GPU {self.name}" if self.kind == "gpu" else f"MIG device {self.name}"

    def to_dict(self) -> dict:
        out = {"strategy": self.strategy, "replicas": self.replicas, "resource": self.resource,
               "rename": self.rename, "fail_requests_greater_than_one": self.fail_requests_greater_than_one}
        if self.strategy == "time-slicing":
            out["interval"] = self.interval or "Default"
        else:
            out["active_thread_percentage"] = self.active_thread_percentage
            out["pinned_memory_limit_mib"] = self.pinned_memory_limit_mib
        return out


@dataclass(frozen=True)
class GpuSharing:
    """What a GPU needs for the sharing of itself or its MIG devices."""
    uuid: str
    index: int
    compute_mode: str               # EXCLUSIVE_PROCESS for MPS, DEFAULT for time-slicing
    interval: str | None            # time-slice, whole GPUs only


@dataclass(frozen=True)
class Desired:
    devices: dict[str, DeviceSharing]          # device uuid -> its sharing
    gpus: dict[str, GpuSharing]                # GPU uuid -> what it needs
    problems: tuple[str, ...] = ()             # entries left out (lenient resolve only)

    @property
    def daemons(self) -> dict[str, DeviceSharing]:
        return {u: d for u, d in self.devices.items() if d.strategy == "mps"}


def _fail(what: str, source: str | None) -> ConfigError:
    return ConfigError(what, where=source, hint=f"see {DOC}")


def _mig_key(profile: str) -> str:
    return profile.replace("+", ".")        # as the device plugin and GFD name MIG resources


def resource_devices(inv: Inventory, name: str, mig_strategy: str) -> list | None:
    """The devices a resource name stands for (None: no such resource on this node).
    ``nvidia.com/gpu``: GPUs without MIG enabled (plus the MIG devices under the single
    strategy); ``nvidia.com/mig-<profile>``: the MIG devices of a profile this node's GPUs
    offer (none may exist yet)."""
    if name == GPU_RESOURCE:
        out = [g for g in inv.gpus if not g.mig_enabled]
        return out + list(inv.mig_devices) if mig_strategy == "single" else out
    m = re.fullmatch(re.escape(PREFIX) + r"/mig-(.+)", name)
    if m is None:
        return None
    known = {_mig_key(p.name) for g in inv.gpus if g.mig for p in g.mig.profiles}
    known |= {_mig_key(d.profile) for d in inv.mig_devices}
    if m.group(1) not in known:
        return None
    return [d for d in inv.mig_devices if _mig_key(d.profile) == m.group(1)]


def _find(inv: Inventory, ref: str):
    legacy = re.fullmatch(r"MIG-(GPU-[0-9a-fA-F-]{36})/([0-9]+)/([0-9]+)", ref)
    if legacy:
        return next((d for d in inv.mig_devices if (d.parent_uuid, str(d.gi), str(d.ci)) == legacy.groups()), None)
    return inv.find(ref)


def _label(dev) -> str:
    return f"GPU {dev.index}" if isinstance(dev, Gpu) else f"MIG device {dev.name}"


def _selected(inv: Inventory, config: SharingConfig, r: ResourceSpec, problems: list | None) -> list:
    """The resource entry's devices. ``problems`` None: strict, a device or resource this node
    lacks is an error; else it is noted there and left out (a configuration in force whose
    MIG devices went with a layout change, or whose GPU fell off the bus)."""
    def missing(what: str) -> None:
        if problems is None:
            raise _fail(what, config.source)
        problems.append(what)

    devices = resource_devices(inv, r.name, config.mig_strategy)
    if devices is None:
        profiles = sorted({_mig_key(p.name) for g in inv.gpus if g.mig for p in g.mig.profiles})
        offered = ", ".join([GPU_RESOURCE] + [f"{PREFIX}/mig-{p}" for p in profiles])
        missing(f"{r.where}.name: no resource {r.name!r} on this node (it offers {offered})")
        return []
    if r.devices == "all":
        return devices
    if isinstance(r.devices, int):
        if r.devices > len(devices):
            missing(f"{r.where}.devices: asks for the first {r.devices} device(s) of {r.name}, which has "
                    f"{len(devices)}")
        return devices[:r.devices]
    out = []
    for ref in r.devices:
        dev = _find(inv, ref)
        if dev is None:
            missing(f"{r.where}.devices: no device {ref!r} on this node")
            continue
        if dev not in devices:
            why = (" (MIG is enabled on it: share its MIG devices, nvidia.com/mig-<profile>)"
                   if isinstance(dev, Gpu) and dev.mig_enabled else "")
            raise _fail(f"{r.where}.devices: {_label(dev)} ({ref}) is not a {r.name} device{why}", config.source)
        if dev not in out:
            out.append(dev)
    return out


def _device_sharing(inv: Inventory, s: StrategySpec, r: ResourceSpec, dev, source) -> DeviceSharing:
    gpu = dev if isinstance(dev, Gpu) else next(g for g in inv.gpus if g.index == dev.parent_index)
    what = f"{_label(dev)} ({gpu.name}, compute capability {gpu.compute_capability})"
    common = dict(uuid=dev.uuid, name=str(dev.index) if isinstance(dev, Gpu) else dev.name,
                  kind="gpu" if isinstance(dev, Gpu) else "mig", gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                  strategy=s.strategy, resource=r.name, rename=r.rename, replicas=r.replicas,
                  fail_requests_greater_than_one=s.fail_requests_greater_than_one,
                  memory_mib=dev.memory_mib, where=r.where)
    if s.strategy == "time-slicing":
        if r.interval not in (None, "Default") and isinstance(dev, MigDevice):
            raise _fail(f"{r.where}.interval: {what} is a MIG device; the time-slice interval is a setting "
                        f"of a whole GPU (leave interval out, or Default)", source)
        return DeviceSharing(**common, interval=r.interval)
    if _cc(gpu.compute_capability) < MPS_MIN_CC:
        raise _fail(f"{r.where}: {what} does not support MPS (compute capability "
                    f"{'.'.join(map(str, MPS_MIN_CC))} or newer is needed)", source)
    limit = max_clients(gpu.compute_capability)
    if r.replicas > limit:
        raise _fail(f"{r.where}.replicas: {r.replicas} replicas is more than the {limit} MPS clients "
                    f"{what} allows", source)
    pinned = r.pinned_memory_limit_mib
    if pinned is not None and pinned > dev.memory_mib:
        raise _fail(f"{r.where}.pinnedMemoryLimit: {pinned} MiB is more than the {dev.memory_mib} MiB of "
                    f"{what}", source)
    return DeviceSharing(**common, active_thread_percentage=r.active_thread_percentage or max(1, 100 // r.replicas),
                         pinned_memory_limit_mib=pinned or dev.memory_mib // r.replicas)


def resolve(inv: Inventory, config: SharingConfig, strict: bool = True) -> Desired:
    """``strict``: every device and resource must exist (an apply); else those missing are
    left out and named in ``problems`` (the configuration in force, after the node changed)."""
    devices: dict[str, DeviceSharing] = {}
    problems: list[str] | None = None if strict else []
    for s in config.strategies:
        for r in s.resources:
            for dev in _selected(inv, config, r, problems):
                d = _device_sharing(inv, s, r, dev, config.source)
                before = devices.get(d.uuid)
                if before is not None:
                    if before.strategy != d.strategy:
                        raise _fail(f"{_label(dev)} ({d.uuid}) is shared with both MPS and time-slicing "
                                    f"({before.where}, {d.where}): a device takes one strategy", config.source)
                    raise _fail(f"{_label(dev)} ({d.uuid}) is in two resources ({before.where}, {d.where})",
                                config.source)
                devices[d.uuid] = d
    gpus: dict[str, GpuSharing] = {}
    for d in devices.values():
        mode = EXCLUSIVE_PROCESS if d.strategy == "mps" else DEFAULT
        before = gpus.get(d.gpu_uuid)
        if before is not None and before.compute_mode != mode:
            other = next(o for o in devices.values() if o.gpu_uuid == d.gpu_uuid and o.strategy != d.strategy)
            raise _fail(f"GPU {d.gpu_index}: {other.label} is shared with {other.strategy} and "
                        f"{d.label} with {d.strategy}; they need different compute modes of the GPU "
                        f"({other.where}, {d.where})", config.source)
        interval = d.interval if d.kind == "gpu" and d.interval not in (None, "Default") else None
        gpus[d.gpu_uuid] = GpuSharing(d.gpu_uuid, d.gpu_index, mode,
                                      interval or (before.interval if before else None))
    return Desired(devices, gpus, tuple(problems or ()))
