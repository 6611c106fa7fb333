"""Allocations, pure: normalise a request, pick devices, check conflicts.

An allocation is what a kubelet plugin prepares for a claim or a container: an id, the
devices (named, or described by constraints), and how they are shared. Nothing here does
I/O; the agent writes the transient CDI spec and the checkpoint.

Sharing rules (after the device plugin and the DRA driver): an exclusive allocation's
devices are in no other allocation; time-sliced devices may be in several time-slicing
allocations, MPS devices in several MPS allocations, but never both on one device (they
need different compute modes), and at most ``max_per_device`` allocations on one device.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

from ..errors import ConflictError, UsageError

__all__ = ["Allocation", "Candidate", "normalize", "select", "UnknownDevice", "DeviceBusy",
           "DeviceNotAllocatable", "InsufficientDevices", "AllocationConflict", "ShareLimitReached",
           "AllocationLimitReached", "ID_PATTERN"]

ID_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.:/-]{0,126}[A-Za-z0-9])?$"
_ID_RE = re.compile(ID_PATTERN)
STRATEGIES = ("Exclusive", "TimeSlicing", "MPS")


class UnknownDevice(UsageError):
    code = "unknown_device"


class DeviceBusy(ConflictError):
    code = "device_busy"


class DeviceNotAllocatable(ConflictError):
    code = "device_not_allocatable"


class InsufficientDevices(ConflictError):
    code = "insufficient_devices"


class AllocationConflict(ConflictError):
    code = "allocation_conflict"


class ShareLimitReached(ConflictError):
    code = "share_limit_reached"


class AllocationLimitReached(ConflictError):
    code = "allocation_limit_reached"


@dataclass(frozen=True)
class Allocation:
    id: str
    devices: tuple[str, ...]         # UUIDs, in the order they were chosen
    request: dict                    # the normalised request: what makes a repeat idempotent
    created: float
    # Derived from the host when the spec is written; not part of the checkpoint.
    cdi_devices: tuple[str, ...] = field(default=(), compare=False)
    container_edits: dict = field(default_factory=dict, compare=False)
    spec_path: str = field(default="", compare=False)

    @property
    def strategy(self) -> str:
        return self.request["sharing"]["strategy"]

    def checkpoint(self) -> dict:
        return {"id": self.id, "devices": list(self.devices), "request": self.request,
                "created": self.created}

    @functools.cached_property
    def checkpoint_json(self) -> str:
        """Its checkpoint entry, rendered once: the checkpoint rewrites every allocation at
        each change, and re-rendering them all made an allocation's cost grow with their
        number."""
        return json.dumps(self.checkpoint(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_checkpoint(cls, data: dict) -> "Allocation":
        return cls(id=data["id"], devices=tuple(data["devices"]), request=data["request"],
                   created=float(data["created"]))


@dataclass(frozen=True)
class Candidate:
    """A device as allocation sees it."""
    uuid: str
    name: str                        # "0", or "0:1" for a MIG device
    kind: str                        # "gpu" or "mig"
    product: str
    memory_mib: int
    compute_capability: str
    profile: str | None              # MIG profile; None for a GPU
    order: tuple                     # stable listing order
    unallocatable: str | None = None  # why it cannot be allocated at all, or None


def normalize(body: dict) -> dict:
    """Fill defaults and check what JSON Schema cannot (cross-field rules)."""
    if not _ID_RE.match(body["id"]):
        raise UsageError(f"allocation id {body['id']!r} is not valid", hint=f"it must match {ID_PATTERN}")
    devices = []
    for i, item in enumerate(body["devices"]):
        if "device" in item:
            devices.append({"device": str(item["device"]).strip()})
            continue
        c = dict(item.get("constraints") or {})
        c.setdefault("type", "mig" if "profile" in c else "any")
        if "profile" in c and c["type"] == "gpu":
            raise UsageError(f"devices[{i}]: a MIG profile cannot be asked of a whole GPU")
        devices.append({"constraints": dict(sorted(c.items())), "count": int(item.get("count", 1))})
    sharing = dict(body.get("sharing") or {})
    strategy = sharing.setdefault("strategy", "Exclusive")
    if "mpsConfig" in sharing and strategy != "MPS":
        raise UsageError("sharing.mpsConfig needs sharing.strategy MPS")
    if "timeSlicingConfig" in sharing and strategy != "TimeSlicing":
        raise UsageError("sharing.timeSlicingConfig needs sharing.strategy TimeSlicing")
    if strategy == "TimeSlicing":
        sharing.setdefault("timeSlicingConfig", {}).setdefault("interval", "Default")
    out = {"id": body["id"], "devices": devices, "sharing": sharing}
    if body.get("labels"):
        out["labels"] = dict(sorted(body["labels"].items()))
    return out


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _matches(c: Candidate, constraints: dict) -> bool:
    kind = constraints.get("type", "any")
    if kind != "any" and c.kind != kind:
        return False
    if "profile" in constraints and c.profile != constraints["profile"]:
        return False
    if c.memory_mib < constraints.get("min_memory_mib", 0):
        return False
    if "compute_capability" in constraints and _cc(c.compute_capability) < _cc(constraints["compute_capability"]):
        return False
    product = constraints.get("product")
    return not product or product.lower() in c.product.lower()


def _shares(users: list[tuple[str, str]], strategy: str) -> bool:
    """May a ``strategy`` allocation join these users of a device?"""
    return not users or (strategy != "Exclusive" and all(s == strategy for _, s in users))


def select(request: dict, candidates: list[Candidate], users: dict[str, list[tuple[str, str]]],
           resolve, healthy, max_per_device: int | None = None) -> list[str]:
    """The UUIDs the request gets: named devices first, then each constraint group's.

    ``users``: uuid -> [(allocation id, strategy)] of other allocations; ``resolve(name)``
    -> uuid or None; ``healthy(uuid)`` -> bool; ``max_per_device``: allocations at most on
    one device (None: no limit). Named devices are taken as named; each constraint group
    takes the least shared, then smallest, then first matching devices (best fit: a small
    request does not take a big device while a small one is free), passing over full ones.
    """
    strategy = request["sharing"]["strategy"]
    by_uuid = {c.uuid: c for c in candidates}
    chosen: list[str] = []

    def full(uuid: str) -> bool:
        return max_per_device is not None and len(users.get(uuid, ())) >= max_per_device

    def usable(c: Candidate) -> str | None:
        if c.unallocatable:
            return c.unallocatable
        if not healthy(c.uuid):
            return "unhealthy"
        return None

    for item in request["devices"]:
        if "device" not in item:
            continue
        uuid = resolve(item["device"])
        if uuid is None or uuid not in by_uuid:
            raise UnknownDevice(f"no device {item['device']!r} on this node",
                                hint="name a device by index, UUID, MIG name (0:1) or CDI name as "
                                     "GET /v1/devices lists them", device=item["device"])
        c = by_uuid[uuid]
        if uuid in chosen:
            raise UsageError(f"device {item['device']!r} is asked for twice", device=item["device"])
        why = usable(c)
        if why:
            raise DeviceNotAllocatable(f"device {c.name} ({c.uuid}) cannot be allocated: {why}",
                                       device=c.uuid, reason=why)
        if not _shares(users.get(uuid, []), strategy):
            raise DeviceBusy(f"device {c.name} ({c.uuid}) is in use by another allocation",
                             device=c.uuid, allocations=[a for a, _ in users[uuid]])
        if full(uuid):
            raise ShareLimitReached(
                f"device {c.name} ({c.uuid}) is shared by {len(users[uuid])} allocations, the most "
                f"allocations.max_per_device allows", device=c.uuid, limit=max_per_device,
                hint="release one of them, use another device, or raise allocations.max_per_device")
        chosen.append(uuid)

    for item in request["devices"]:
        if "device" in item:
            continue
        matching = [c for c in candidates if _matches(c, item["constraints"])]
        shareable = [c for c in matching if c.uuid not in chosen and not usable(c)
                     and _shares(users.get(c.uuid, []), strategy)]
        free = [c for c in shareable if not full(c.uuid)]
        free.sort(key=lambda c: (len(users.get(c.uuid, [])), c.memory_mib, c.order))
        if len(free) < item["count"]:
            at_limit = len(shareable) - len(free)
            raise InsufficientDevices(
                f"{item['count']} device(s) matching {item['constraints']} wanted, "
                f"{len(free)} available ({len(matching)} match"
                + (f", {at_limit} shared by allocations.max_per_device allocations already" if at_limit else "")
                + ")",
                wanted=item["count"], available=len(free), matching=len(matching),
                at_share_limit=at_limit, constraints=item["constraints"])
        chosen += [c.uuid for c in free[:item["count"]]]
    return chosen
