"""Who an event affects: a placement index over the inventory, and the raw-to-typed step.

A GPU-wide error (no GPU/compute instance) affects the GPU and every MIG device on it; an
instance-scoped XID only the MIG devices of that GPU instance (and compute instance, when
the driver names one). Every device is listed, not one per physical GPU, so replicas and
MIG siblings are never dropped (device plugin issue #1929). An event scoped to an instance
the inventory does not know is kept on the GPU's own record, marked ``unresolved``, rather
than dropped or spread to the siblings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .policy import XidPolicy
from .records import XID, HealthEvent

__all__ = ["DeviceRef", "DeviceIndex", "to_health_event", "AllocationLookup"]

# device key (UUID) -> ids of the allocations using it; supplied by the daemon.
AllocationLookup = Callable[[str], Iterable[str]]


@dataclass(frozen=True)
class DeviceRef:
    key: str                  # UUID; "gpu:<index>" for a GPU NVML lists but cannot read
    name: str                 # "0" or "0:3"
    gpu: int
    gi: int | None = None
    ci: int | None = None

    @property
    def uuid(self) -> str | None:
        return None if self.key.startswith("gpu:") else self.key


@dataclass(frozen=True)
class DeviceIndex:
    gpus: dict                # index -> DeviceRef
    children: dict            # index -> tuple[DeviceRef, ...] (its MIG devices)

    @classmethod
    def from_inventory(cls, inventory, known: Iterable = ()) -> "DeviceIndex":
        """The devices of ``inventory``. A GPU NVML lists but cannot read (a lost GPU reads
        as nothing but an error) keeps what ``known`` had at its index: its UUID and MIG
        devices, so its health stays under the keys it had; only a GPU never read is
        ``gpu:<index>``. ``known``: the devices before, as records with key, name, gpu, gi
        and ci (``DeviceRef``s, or the ``DeviceHealth`` records of a health state)."""
        known = [DeviceRef(r.key, r.name, r.gpu, r.gi, r.ci) for r in known or ()]
        gpus, children = {}, {}
        for gpu in inventory.gpus:
            gpus[gpu.index] = DeviceRef(gpu.uuid, str(gpu.index), gpu.index)
            children[gpu.index] = tuple(DeviceRef(d.uuid, d.name, gpu.index, d.gi, d.ci)
                                        for d in (gpu.mig.devices if gpu.mig else ()))
        for bad in inventory.unreadable:
            before = next((r for r in known if r.gpu == bad.index and r.gi is None), None)
            if before is not None and before.uuid is not None:
                gpus[bad.index] = before
                children[bad.index] = tuple(r for r in known if r.gpu == bad.index and r.gi is not None)
            else:
                gpus[bad.index] = DeviceRef(f"gpu:{bad.index}", str(bad.index), bad.index)
                children[bad.index] = ()
        return cls(gpus, children)

    def refs(self) -> tuple[DeviceRef, ...]:
        return tuple(r for index in sorted(self.gpus)
                     for r in (self.gpus[index], *self.children[index]))

    def affected(self, gpu: int, gi: int | None, ci: int | None) -> tuple[tuple[DeviceRef, ...], bool]:
        """(devices, unresolved) for an event on ``gpu`` scoped to (gi, ci)."""
        parent = self.gpus.get(gpu)
        if parent is None:
            return (), True
        kids = self.children[gpu]
        if gi is None:
            return (parent, *kids), False
        scoped = tuple(k for k in kids if k.gi == gi and (ci is None or k.ci == ci))
        if not scoped:
            return (parent,), True
        return scoped, False


def to_health_event(raw, index: DeviceIndex, policy: XidPolicy,
                    allocations: AllocationLookup | None = None) -> HealthEvent:
    """A raw event from ``devices.events`` as a typed health event, fanned out."""
    refs, unresolved = index.affected(raw.gpu, raw.gi, raw.ci)
    keys = tuple(r.key for r in refs)
    allocs: list[str] = []
    if allocations is not None:
        for key in keys:
            allocs += [a for a in allocations(key) if a not in allocs]
    parent = index.gpus.get(raw.gpu)
    return HealthEvent(
        kind=raw.kind, gpu=raw.gpu, gpu_uuid=raw.uuid or (parent.uuid if parent else None), at=raw.at, xid=raw.xid, ignored=raw.kind == XID and policy.ignored(raw.xid),
        gi=raw.gi, ci=raw.ci, devices=keys, allocations=tuple(allocs), unresolved=unresolved,
        detail=raw.detail)
