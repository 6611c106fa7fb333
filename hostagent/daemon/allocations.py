"""Allocations, pure: normalise a request, pick devices, check conflicts.

An allocation is what a kubelet plugin prepares for a claim or a container: an id, the
devices (named, or described by constraints), how they are shared, and its owner (the uid
that made it: only that uid, or root, may release it or replace it with another). Nothing here does
I/O; the agent writes the transient CDI spec and the checkpoint.

Sharing rules (after the device plugin and the DRA driver): an exclusive allocation's
devices are in no other allocation; time-sliced devices may be in several time-slicing
allocations, MPS devices in several MPS allocations, but never both on one device (they
need different compute modes), and at most ``max_per_device`` allocations on one device.

A device the node's sharing configuration shares (``Candidate.shared``) is shared the way
it says: its allocations take its replicas (``<uuid>::<n>``, as the device plugin names
them; a plain name or a constraint takes a free one), at most one allocation a replica, and
the request's strategy, if it names one, must be the configured one. MPS is there only where
the configuration runs a daemon; an MPS allocation takes one device (a CUDA process talks to
one MPS control daemon); ``failRequestsGreaterThanOne`` limits a request to one replica.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

from ..errors import ConflictError, PermissionDenied, UsageError
from .connected import Unconnected, take

__all__ = ["Allocation", "Candidate", "Selection", "normalize", "select", "NotOwner", "UnknownDevice", "DeviceBusy",
           "DeviceNotAllocatable", "InsufficientDevices", "AllocationConflict", "ShareLimitReached",
           "AllocationLimitReached", "SharingMismatch", "AllocationTooLarge", "ReservedId", "RESERVED_PREFIXES", "ID_PATTERN", "replica_of",
           "MAX_LABEL_BYTES", "MAX_ENTRY_BYTES", "check_size"]

ID_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.:/-]{0,126}[A-Za-z0-9])?$"
_ID_RE = re.compile(ID_PATTERN)
STRATEGIES = ("Exclusive", "TimeSlicing", "MPS")
# The request's strategy names for the sharing configuration's ("mps", "time-slicing").
REQUEST_STRATEGY = {"mps": "MPS", "time-slicing": "TimeSlicing"}
_REPLICA = re.compile(r"(.+)::([0-9]+)")
# What one allocation may carry, in bytes as its checkpoint entry holds it (JSON, escaped:
# a 4-byte emoji is 12 bytes there). Far above what a plugin records (a pod's name and
# namespace), and small enough that no caller's allocations outgrow the checkpoint.
MAX_LABEL_BYTES = 16 << 10
MAX_ENTRY_BYTES = 64 << 10


def replica_of(name: str) -> tuple[str, int] | None:
    """``<uuid>::<n>`` -> (uuid, n); None for any other name."""
    m = _REPLICA.fullmatch(name)
    return (m.group(1), int(m.group(2))) if m else None


class NotOwner(PermissionDenied):
    code = "not_owner"


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


class SharingMismatch(ConflictError):
    code = "sharing_mismatch"


class AllocationTooLarge(UsageError):
    code = "allocation_too_large"


class ReservedId(PermissionDenied):
    code = "reserved_id"


# The kubelet plugins' ids (hostagent.plugins.dra.prepare, hostagent.plugins.allocations):
# only root and api.plugin_uids may make allocations under them.
RESERVED_PREFIXES = ("k8s-dra/", "k8s-device-plugin/")


def _escaped_size(value) -> int:
    """Bytes of ``value`` as the checkpoint writes it."""
    return len(json.dumps(value, sort_keys=True, separators=(",", ":")))


def check_size(alloc: "Allocation") -> None:
    """An allocation whose checkpoint entry is larger than ``MAX_ENTRY_BYTES`` is refused."""
    size = len(alloc.checkpoint_json)
    if size > MAX_ENTRY_BYTES:
        raise AllocationTooLarge(f"allocation {alloc.id!r} would take {size} bytes in the checkpoint, more than "
                                 f"{MAX_ENTRY_BYTES}", size=size, limit=MAX_ENTRY_BYTES,
                                 hint="ask for fewer devices, or give shorter labels and device names")


@dataclass(frozen=True)
class Allocation:
    id: str
    devices: tuple[str, ...]         # UUIDs, in the order they were chosen
    request: dict                    # the normalised request: what makes a repeat idempotent
    created: float
    replicas: tuple[str, ...] = ()   # the replica ids it holds (devices the sharing configuration shares)
    shared_as: str | None = None     # "mps" or "time-slicing" when the configuration shares its devices
    owner: int = 0                   # the uid that made it: it (or root) may release or replace it
    device_sharing: dict = field(default_factory=dict)   # uuid -> its own sharing, where a named item gave one
    made: tuple[dict, ...] = ()      # MIG devices made for it: {uuid, gpu, profile, start}, destroyed with it
    mps: dict | None = None          # its own MPS control daemon: {key, devices, process}
    passthrough: tuple[dict, ...] = ()   # GPUs passed through: {gpu, uuid, group, functions, persistence, iommufd}
    # Derived from the host when the spec is written; not part of the checkpoint.
    cdi_devices: tuple[str, ...] = field(default=(), compare=False)
    container_edits: dict = field(default_factory=dict, compare=False)
    spec_path: str | None = field(default=None, compare=False)   # None: no transient spec

    @property
    def strategy(self) -> str:
        """The strategy it shares its devices under: the configured one on devices the
        sharing configuration shares, else the request's."""
        return REQUEST_STRATEGY[self.shared_as] if self.shared_as else self.request["sharing"]["strategy"]

    @property
    def own_spec(self) -> bool:
        """Whether it gets a transient CDI spec of its own: when asked for (the default), and
        always for an MPS client, whose pipe, shared memory and limits no node spec holds.
        Otherwise its names are the node spec's, and nothing is written but the checkpoint."""
        return (self.request.get("cdi_names") != "node" or self.shared_as == "mps" or self.mps is not None
                or bool(self.passthrough))

    @property
    def sharing(self) -> dict:
        return {**self.request["sharing"], "strategy": self.strategy}

    def sharing_of(self, uuid: str) -> dict:
        """How one of its devices is shared: the configured way on devices the sharing
        configuration shares, else its item's own sharing, else the allocation's."""
        if self.shared_as:
            return self.sharing
        return self.device_sharing.get(uuid) or self.request["sharing"]

    def strategy_of(self, uuid: str) -> str:
        return self.sharing_of(uuid)["strategy"]

    def checkpoint(self) -> dict:
        out = {"id": self.id, "devices": list(self.devices), "request": self.request, "created": self.created,
               "owner": self.owner}
        if self.shared_as:
            out.update(replicas=list(self.replicas), shared_as=self.shared_as)
        if self.device_sharing:
            out["device_sharing"] = self.device_sharing
        if self.made:
            out["made"] = list(self.made)
        if self.mps:
            out["mps"] = self.mps
        if self.passthrough:
            out["passthrough"] = list(self.passthrough)
        return out

    @functools.cached_property
    def checkpoint_json(self) -> str:
        """Its checkpoint entry, rendered once: the checkpoint rewrites every allocation at
        each change, and re-rendering them all made an allocation's cost grow with their
        number."""
        return json.dumps(self.checkpoint(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_checkpoint(cls, data: dict) -> "Allocation":
        return cls(id=data["id"], devices=tuple(data["devices"]), request=data["request"],
                   created=float(data["created"]), replicas=tuple(data.get("replicas", ())),
                   shared_as=data.get("shared_as"), owner=int(data.get("owner", 0)),
                   device_sharing=dict(data.get("device_sharing") or {}), made=tuple(data.get("made") or ()),
                   mps=data.get("mps"), passthrough=tuple(data.get("passthrough") or ()))

    def own_mps_devices(self) -> list[str]:
        """The devices its own MPS daemon serves: those it shares with MPS that the sharing
        configuration does not (it asked for a daemon of its own)."""
        if self.shared_as or not self.request.get("own_mps_daemon"):
            return []
        return [u for u in self.devices if self.strategy_of(u) == "MPS"]

    def may_change(self, uid: int) -> bool:
        """May ``uid`` release or replace it? Its owner and root may."""
        return uid == 0 or uid == self.owner


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
    shared: dict | None = None        # how the sharing configuration shares it (strategy, replica_ids,
                                      # fail_requests_greater_than_one), None: it does not


@dataclass(frozen=True)
class Selection:
    devices: list[str]               # UUIDs, in the order chosen
    replicas: list[str] = field(default_factory=list)     # replica ids taken on shared devices
    shared_as: str | None = None     # the configured strategy of shared devices
    sharing: dict = field(default_factory=dict)           # uuid -> its named item's own sharing


def _sharing(raw: dict | None, where: str) -> dict:
    sharing = dict(raw or {})
    strategy = sharing.setdefault("strategy", "Exclusive")
    if "mpsConfig" in sharing and strategy != "MPS":
        raise UsageError(f"{where}.mpsConfig needs {where}.strategy MPS")
    if "timeSlicingConfig" in sharing and strategy != "TimeSlicing":
        raise UsageError(f"{where}.timeSlicingConfig needs {where}.strategy TimeSlicing")
    if strategy == "TimeSlicing":
        sharing["timeSlicingConfig"] = {"interval": "Default", **(sharing.get("timeSlicingConfig") or {})}
    return sharing


def normalize(body: dict) -> dict:
    """Fill defaults and check what JSON Schema cannot (cross-field rules)."""
    if not _ID_RE.fullmatch(body["id"]):
        raise UsageError(f"allocation id {body['id']!r} is not valid", hint=f"it must match {ID_PATTERN}")
    devices = []
    passthrough = [i for i, item in enumerate(body["devices"]) if "passthrough" in item]
    if passthrough and len(passthrough) != len(body["devices"]):
        raise UsageError("an allocation passes GPUs through or allocates devices, not both",
                         hint="make one allocation for the GPUs to pass through and another for the rest")
    if passthrough and (body.get("sharing") or {}).get("strategy", "Exclusive") != "Exclusive":
        raise UsageError("a GPU passed through is a VM's alone: it cannot be shared",
                         hint="leave sharing out, or make it Exclusive")
    for i, item in enumerate(body["devices"]):
        if "passthrough" in item:
            devices.append({"passthrough": {"gpu": str(item["passthrough"]["gpu"]).strip(),
                                            "iommufd": bool(item["passthrough"].get("iommufd", False))}})
            continue
        if "device" in item or "mig" in item:
            out = {"device": str(item["device"]).strip()} if "device" in item else {
                "mig": {"gpu": str(item["mig"]["gpu"]).strip(), "profile": item["mig"]["profile"],
                        "start": int(item["mig"]["start"])}}
            if "sharing" in item:
                out["sharing"] = _sharing(item["sharing"], f"devices[{i}].sharing")
            devices.append(out)
            continue
        c = dict(item.get("constraints") or {})
        c.setdefault("type", "mig" if "profile" in c else "any")
        if "profile" in c and c["type"] == "gpu":
            raise UsageError(f"devices[{i}]: a MIG profile cannot be asked of a whole GPU")
        devices.append({"constraints": dict(sorted(c.items())), "count": int(item.get("count", 1))})
    sharing = _sharing(body.get("sharing"), "sharing")
    out = {"id": body["id"], "devices": devices, "sharing": sharing}
    if body.get("cdi_names", "allocation") != "allocation":     # the default is left out, as before
        out["cdi_names"] = body["cdi_names"]
    if body.get("own_mps_daemon"):
        out["own_mps_daemon"] = True
    if body.get("labels"):
        out["labels"] = dict(sorted(body["labels"].items()))
        size = _escaped_size(out["labels"])
        if size > MAX_LABEL_BYTES:
            raise AllocationTooLarge(f"the labels take {size} bytes as the checkpoint records them (JSON, non-ASCII "
                                     f"characters escaped), more than {MAX_LABEL_BYTES}", size=size,
                                     limit=MAX_LABEL_BYTES, hint="give shorter labels")
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
           resolve, healthy, max_per_device: int | None = None,
           taken: dict[str, set[str]] | None = None, links=None) -> Selection:
    """The devices (and replicas) the request gets: named devices first, then each
    constraint group's.

    ``users``: uuid -> [(allocation id, strategy)] of other allocations; ``resolve(name)``
    -> uuid or None; ``healthy(uuid)`` -> bool; ``max_per_device``: allocations at most on
    one unshared device (None: no limit); ``taken``: uuid -> replica ids other allocations
    hold; ``links``: how the GPUs are connected (``topology.ranking.Links``). Named devices
    are taken as named; each constraint group takes the best-connected of the least shared,
    then smallest, then first matching devices (best fit: a small request does not take a
    big device while a small one is free), passing over full ones (``connected.take``).
    """
    default = request["sharing"]["strategy"]
    own_mps = bool(request.get("own_mps_daemon"))
    taken = taken or {}
    by_uuid = {c.uuid: c for c in candidates}
    chosen: list[str] = []
    replicas: list[str] = []
    own: dict[str, dict] = {}

    def full(uuid: str) -> bool:
        return max_per_device is not None and len(users.get(uuid, ())) >= max_per_device

    def usable(c: Candidate) -> str | None:
        if c.unallocatable:
            return c.unallocatable
        if not healthy(c.uuid):
            return "unhealthy"
        return None

    def mismatch(c: Candidate, strategy: str) -> str | None:
        """Why ``strategy`` cannot be had on ``c``; None if it can."""
        if c.shared is None:
            return ("it is not shared with MPS (MPS needs its control daemon: share it with MPS in the "
                    "node's sharing configuration, or ask for own_mps_daemon)") if strategy == "MPS" and not own_mps \
                else None
        if strategy != "Exclusive" and REQUEST_STRATEGY[c.shared["strategy"]] != strategy:
            return f"the node shares it with {c.shared['strategy']}, not {strategy}"
        return None

    def free(c: Candidate) -> list[str]:
        return [r for r in c.shared["replica_ids"] if r not in taken.get(c.uuid, ()) and r not in replicas]

    def conflict(c: Candidate, strategy: str) -> str:
        """The strategy its conflicts are judged by: a daemon of the allocation's own is the
        device's alone."""
        return "Exclusive" if strategy == "MPS" and own_mps and c.shared is None else strategy

    def fits(c: Candidate, strategy: str) -> bool:
        if c.shared is not None:
            return bool(free(c))
        return _shares(users.get(c.uuid, []), conflict(c, strategy)) and not full(c.uuid)

    for item in request["devices"]:
        if "mig" in item:
            raise UsageError("a MIG device to make must be made before devices are selected")
        if "device" not in item:
            continue
        strategy = (item.get("sharing") or request["sharing"])["strategy"]
        name = item["device"]
        replica = replica_of(name)
        uuid = resolve(replica[0] if replica else name)
        if uuid is None or uuid not in by_uuid or (replica and (
                by_uuid[uuid].shared is None or name not in by_uuid[uuid].shared["replica_ids"])):
            what = "replica" if replica else "device"
            raise UnknownDevice(f"no {what} {name!r} on this node",
                                hint="name a device by index, UUID, MIG name (0:1) or CDI name, or a replica "
                                     "(<uuid>::<n>), as GET /v1/devices lists them", device=name)
        c = by_uuid[uuid]
        if uuid in chosen and (not replica or c.shared is None):
            raise UsageError(f"device {name!r} is asked for twice", device=name)
        why = usable(c) or mismatch(c, strategy)
        if why:
            raise DeviceNotAllocatable(f"device {c.name} ({c.uuid}) cannot be allocated: {why}",
                                       device=c.uuid, reason=why)
        if c.shared is not None:
            want = name if replica else (free(c) or [None])[0]
            if want in replicas:
                raise UsageError(f"replica {name!r} is asked for twice", device=name)
            if want is None or want not in free(c):
                holders = sorted(a for a, _ in users.get(uuid, ()))
                raise DeviceBusy(f"{'replica ' + name if replica else f'every replica of device {c.name} ({c.uuid})'} "
                                 f"is in use by another allocation", device=c.uuid, allocations=holders)
            replicas.append(want)
        elif not _shares(users.get(uuid, []), conflict(c, strategy)):
            raise DeviceBusy(f"device {c.name} ({c.uuid}) is in use by another allocation",
                             device=c.uuid, allocations=[a for a, _ in users[uuid]])
        elif full(uuid):
            raise ShareLimitReached(
                f"device {c.name} ({c.uuid}) is shared by {len(users[uuid])} allocations, the most "
                f"allocations.max_per_device allows", device=c.uuid, limit=max_per_device,
                hint="release one of them, use another device, or raise allocations.max_per_device")
        if uuid not in chosen:
            chosen.append(uuid)
            if "sharing" in item and c.shared is None:
                own[uuid] = item["sharing"]

    for item in request["devices"]:
        if "device" in item:
            continue
        matching = [c for c in candidates if _matches(c, item["constraints"])]
        shareable = [c for c in matching if c.uuid not in chosen and not usable(c) and not mismatch(c, default)
                     and (c.shared is not None or _shares(users.get(c.uuid, []), conflict(c, default)))]
        room = [c for c in shareable if fits(c, default)]
        room.sort(key=lambda c: (len(users.get(c.uuid, [])), c.memory_mib, c.order))
        if len(room) < item["count"]:
            at_limit = len(shareable) - len(room)
            reasons: dict[str, int] = {}
            for c in matching:
                why = usable(c)
                if why:
                    reasons[why] = reasons.get(why, 0) + 1
            raise InsufficientDevices(
                f"{item['count']} device(s) matching {item['constraints']} wanted, "
                f"{len(room)} available ({len(matching)} match"
                + "".join(f", {n} {why}" for why, n in reasons.items())
                + (f", {at_limit} shared by allocations.max_per_device allocations or with every replica "
                   f"taken already" if at_limit else "")
                + ")",
                wanted=item["count"], available=len(room), matching=len(matching),
                at_share_limit=at_limit, constraints=item["constraints"])
        try:
            group = take(room, item["count"], item["constraints"], links)
        except Unconnected as e:
            raise InsufficientDevices(
                f"no {item['count']} free device(s) matching {item['constraints']} with {e}",
                wanted=item["count"], available=len(room), constraints=item["constraints"], best=e.best,
                hint="ask for fewer devices, drop the topology constraint, or free devices so connected") from None
        for c in group:
            chosen.append(c.uuid)
            if c.shared is not None:
                replicas.append(free(c)[0])
    selection = _shared_selection(chosen, replicas, by_uuid)
    return Selection(selection.devices, selection.replicas, selection.shared_as,
                     {} if selection.shared_as else own)


def _shared_selection(chosen: list[str], replicas: list[str], by_uuid: dict[str, Candidate]) -> Selection:
    """The devices chosen are shared one way (or not at all), an MPS allocation is one
    device, and a shared resource that fails requests greater than one gets one replica."""
    kinds = {by_uuid[u].shared["strategy"] if by_uuid[u].shared else None for u in chosen}
    if len(kinds) > 1:
        names = ", ".join(f"{by_uuid[u].name} ({by_uuid[u].shared['strategy'] if by_uuid[u].shared else 'not shared'})"
                          for u in chosen)
        raise SharingMismatch(f"the devices are shared in different ways: {names}",
                              hint="an allocation takes devices the node shares one way (or unshared ones)")
    shared_as = kinds.pop() if kinds else None
    if shared_as == "mps" and len(chosen) > 1:
        raise UsageError(f"an MPS allocation takes one device, not {len(chosen)}: each has its own MPS control "
                         f"daemon, and a CUDA process talks to one", devices=chosen)
    if shared_as and len(replicas) > 1 and any(by_uuid[u].shared["fail_requests_greater_than_one"] for u in chosen):
        raise UsageError(f"maximum request size for shared resources is 1; found {len(replicas)}",
                         hint="ask for one replica, or set failRequestsGreaterThanOne: false in the sharing "
                              "configuration", replicas=replicas)
    return Selection(chosen, replicas if shared_as else [], shared_as)
