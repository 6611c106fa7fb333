"""On-demand MIG instances, pure: where one more instance of a profile goes, and what
removing one leaves. The result is a ``MigPlan`` for the MIG package's executor (journal,
rollback, capability nodes); nothing here touches the node.

Placement uses the MIG package's solver with the GPU's existing instances as they are:
a GPU where the new instance fits only by moving an existing one is not a candidate
(existing instances may be in use). Among candidates the best fit wins: the GPU left
with the fewest free memory slices (big free GPUs stay whole for big profiles), then the
one whose largest free run of slices is longest (least fragmentation), then the lowest
index.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..devices.records import Gpu, Inventory, MigDevice
from ..errors import StateError, UnknownName, UsageError
from ..mig.layout import GiLayout, Layout
from ..mig.plan import MigPlan, affected_devices, diff
from ..mig.quirks import mig_profiles
from ..mig.planner import PLAN_SECONDS
from ..mig.solver import Budget, Geometry, Infeasible, SearchAborted, solve

__all__ = ["Placed", "place_instance", "remove_instance", "affected_devices", "busy_allocations", "refuse_allocated",
           "UnreadableHolder", "unreadable_holders", "created_instance", "NoRoom"]


class NoRoom(StateError):
    code = "insufficient_resources"


@dataclass(frozen=True)
class Placed:
    gpu: Gpu
    gi: GiLayout             # the new GPU instance
    plan: MigPlan
    free_slices: int         # memory slices left free on the GPU afterwards
    largest_run: int


def _slices(gpu: Gpu) -> int:
    return max((pl.start + pl.size for p in gpu.mig.profiles for pl in p.placements), default=0)


def _free(gpu: Gpu, gis) -> tuple[int, int]:
    used = [False] * _slices(gpu)
    for gi in gis:
        for s in range(gi.start, gi.start + gi.size):
            used[s] = True
    run = best = 0
    for u in used:
        run = 0 if u else run + 1
        best = max(best, run)
    return used.count(False), best


def _one_more(gpu: Gpu, profile_name: str, budget: Budget) -> tuple[Layout, GiLayout] | None:
    before = Layout.of(gpu)
    profile = next((p for p in gpu.mig.profiles if p.name == profile_name), None)
    if profile is None:
        return None
    request: dict[int, list[int]] = {}
    for gi in before.gis:
        request.setdefault(gi.profile_id, []).extend(c.slices for c in gi.cis)
    request.setdefault(profile.id, []).append(profile.slices)
    try:
        gis = solve(Geometry.of(mig_profiles(gpu)), request, before.gis, budget)
    except Infeasible:
        return None
    if not set(before.gis) <= set(gis):
        return None                       # only by moving an existing instance
    new = [g for g in gis if g not in before.gis]
    if len(new) != 1:
        return None
    return Layout(True, True, tuple(gis)), new[0]


def place_instance(inventory: Inventory, profile: str, gpu: str | None = None,
                   budget: Budget | None = None) -> Placed:
    """The plan creating one ``profile`` instance (a GPU instance with one compute instance
    spanning it) on ``gpu`` (index or UUID) or the best-fitting GPU."""
    gpus = [g for g in inventory.gpus if g.mig is not None]
    if gpu is not None:
        chosen = [g for g in inventory.gpus if gpu in (str(g.index), g.uuid)]
        if not chosen:
            raise UnknownName(f"no GPU {gpu!r}", name=gpu)
        g = chosen[0]
        if g.mig is None:
            raise StateError(f"GPU {g.index} ({g.name}) is not MIG capable")
        if not (g.mig.enabled and g.mig.pending):
            raise StateError(f"MIG is not enabled on GPU {g.index}",
                             hint="enable it first (apply a layout with mig-enabled: true)")
        gpus = [g]
    known = {p.name for g in gpus if g.mig for p in g.mig.profiles}
    if profile not in known:
        raise UsageError(f"no GPU here has a MIG profile {profile!r}",
                         hint=f"profiles: {', '.join(sorted(known)) or 'none (no MIG-capable GPU)'}")
    options = []
    budget = budget or Budget(PLAN_SECONDS)
    for g in gpus:
        if not (g.mig.enabled and g.mig.pending):
            continue                      # enabling MIG is a layout change, not on demand
        try:
            found = _one_more(g, profile, budget)
        except SearchAborted as e:
            raise StateError(f"GPU {g.index}: {e}") from None
        if found is None:
            continue
        after, new = found
        free, run = _free(g, after.gis)
        plan = MigPlan(config=f"create {profile}", gpus=(diff(g, Layout.of(g), after, reset_needed=False),))
        options.append(Placed(g, new, plan, free, run))
    if not options:
        where = f"GPU {gpus[0].index}" if gpu is not None else "any MIG-enabled GPU"
        raise NoRoom(f"no room for a {profile} instance on {where} without moving existing instances",
                     profile=profile)
    return min(options, key=lambda o: (o.free_slices, -o.largest_run, o.gpu.index))


def remove_instance(inventory: Inventory, uuid: str) -> tuple[MigDevice, MigPlan]:
    """The plan destroying MIG device ``uuid``: its compute instance, and its GPU instance
    when that holds no other compute instance."""
    for g in inventory.gpus:
        for dev in (g.mig.devices if g.mig else ()):
            if dev.uuid != uuid:
                continue
            before = Layout.of(g)
            gis = []
            for gi in before.gis:
                if gi.start != dev.placement.start or gi.profile_id != dev.gi_profile_id:
                    gis.append(gi)
                    continue
                rest = tuple(c for c in gi.cis if c.start != dev.ci_placement.start)
                if rest:
                    gis.append(GiLayout(gi.start, gi.size, gi.profile_id, gi.profile, gi.slices, rest))
            after = Layout(before.enabled, before.pending, tuple(gis))
            return dev, MigPlan(config=f"destroy {uuid}", gpus=(diff(g, before, after, reset_needed=False),))
    raise UnknownName(f"no MIG device {uuid!r}", name=uuid, hint="GET /v1/devices?type=mig lists them")


@dataclass(frozen=True)
class UnreadableHolder:
    """A record of the allocations checkpoint that could not be read (``checkpoint.Unreadable``),
    as what holds the devices it may hold: those it names, or every device when it names
    none. Until an admin dismisses it, no MIG change takes them away."""
    id: str                  # how busy lists and errors name it (never an allocation's id: it has spaces)
    devices: tuple[str, ...]
    kept_as: str
    reason: str


def unreadable_holders(inventory: Inventory, records) -> list[UnreadableHolder]:
    every = tuple(u for g in inventory.gpus for u in (g.uuid, *(d.uuid for d in (g.mig.devices if g.mig else ()))))
    return [UnreadableHolder(f"unreadable checkpoint record {n}", every if r.devices is None else tuple(r.devices),
                             r.kept_as, r.reason) for n, r in enumerate(records, 1)]


def busy_allocations(inventory: Inventory, plan: MigPlan, allocations, unreadable=()) -> list[dict]:
    """The allocations holding devices ``plan`` would take away: each one's ``id``,
    ``labels`` and those ``devices`` (UUIDs), by id (what an apply would be refused for);
    then the unreadable checkpoint records (``UnreadableHolder``) that may hold some, each
    with ``unreadable`` saying where it is kept and why."""
    affected = affected_devices(inventory, plan)
    out = [{"id": a.id, "labels": dict(a.request.get("labels") or {}),
            "devices": sorted(affected.intersection(a.devices))}
           for a in sorted(allocations, key=lambda a: a.id) if affected.intersection(a.devices)]
    return out + [{"id": h.id, "labels": {}, "devices": sorted(affected.intersection(h.devices)),
                   "unreadable": {"kept_as": h.kept_as, "reason": h.reason}}
                  for h in unreadable if affected.intersection(h.devices)]


def refuse_allocated(inventory: Inventory, plan: MigPlan, allocations, *, unreadable=(),
                     hint: str = "release their allocations first (hostagent allocations release ID); --force "
                                 "does not take allocated devices while the daemon runs") -> None:
    """DeviceBusy if ``plan`` would take away a device of one of ``allocations`` (objects
    with ``id`` and ``devices``, the device UUIDs), or one an unreadable checkpoint record
    may hold (``unreadable``: ``UnreadableHolder``, refused first)."""
    from .allocations import DeviceBusy
    affected = affected_devices(inventory, plan)
    records = [h for h in unreadable if affected.intersection(h.devices)]
    if records:
        held = sorted({u for h in records for u in h.devices if u in affected})
        raise DeviceBusy(f"the change would take away device(s) {', '.join(held)} that unreadable allocations "
                         f"checkpoint record(s) may hold", devices=held, allocations=[h.id for h in records],
                         kept_as=[h.kept_as for h in records],
                         hint="an admin checks the records (GET /v1/checkpoint/unreadable) and, once they are "
                              "settled, dismisses them (hostagent allocations dismiss-unreadable); then apply again")
    holders = [a for a in allocations if affected.intersection(a.devices)]
    if holders:
        busy = sorted({u for a in holders for u in a.devices if u in affected})
        raise DeviceBusy(f"the change would take away allocated device(s) {', '.join(busy)}",
                         hint=hint, devices=busy, allocations=sorted({a.id for a in holders}))


def created_instance(inventory: Inventory, gpu_index: int, gi: GiLayout) -> MigDevice | None:
    """The MIG device of a new GPU instance, found by placement in a fresh inventory."""
    for g in inventory.gpus:
        if g.index == gpu_index and g.mig:
            for dev in g.mig.devices:
                if dev.placement.start == gi.start and dev.gi_profile_id == gi.profile_id:
                    return dev
    return None

