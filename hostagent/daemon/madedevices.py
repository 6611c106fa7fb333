"""MIG devices made for allocations: a GPU instance of a profile at exactly the placement an
allocation names (a DRA claim's partition), with one compute instance spanning it, destroyed
when the allocation is released.

``plan_made`` is pure: it refuses what the GPU cannot take there (MIG not enabled, a
placement the profile does not have, slices another instance holds, more than the GPU's
compute slices or engines allow beside its instances) and plans every GPU's additions as one
MIG plan each, for the MIG package's executor (all or nothing, rolled back on failure).
``make`` records its intent in a journal before it touches the node, so that a crash before
the allocation's commit is undone at the next start (``recover``); the allocator removes the
journal once the checkpoint holds the allocation (``done``). A release goes the other way:
``releasing`` records the devices of the allocations going before their commit, which
drops them from the checkpoint; the devices are destroyed after it (``unmake``), and a
crash (or a failure) in between is finished at the next start (``recover``), so a commit
that fails never leaves an allocation whose devices are gone.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from ..devices.records import Gpu, Inventory
from ..errors import HostagentError, StateError, UsageError
from ..fileio import write_atomic
from ..mig.layout import GiLayout, Layout
from ..mig.plan import MigPlan, diff
from ..mig.quirks import mig_profiles
from ..mig.solver import Geometry, budget_error, pack_compute_instances
from .migops import NoRoom

__all__ = ["Wanted", "plan_made", "make", "unmake", "done", "recover", "journal_path", "check_idle", "releasing",
           "released"]

log = logging.getLogger("hostagent.daemon")

JOURNAL = "allocation-making.json"
RELEASING = "allocation-releasing.json"


@dataclass(frozen=True)
class Wanted:
    item: int                 # its place in the request's devices
    gpu: Gpu
    gi: GiLayout

    def record(self, uuid: str) -> dict:
        return {"uuid": uuid, "gpu": self.gpu.uuid, "profile": self.gi.profile, "start": self.gi.start}


def journal_path(host):
    return host.state_dir / JOURNAL


def _gpu(inventory: Inventory, name: str, where: str) -> Gpu:
    for g in inventory.gpus:
        if name in (str(g.index), g.uuid):
            return g
    from .allocations import UnknownDevice
    raise UnknownDevice(f"{where}.gpu: no GPU {name!r} on this node", device=name,
                        hint="name the GPU by index or UUID, as GET /v1/devices lists it")


def plan_made(inventory: Inventory, request: dict) -> tuple[list[Wanted], MigPlan]:
    """The MIG devices the request's ``mig`` items make, and the plan making them."""
    wanted: list[Wanted] = []
    by_gpu: dict[str, list[GiLayout]] = {}
    for i, item in enumerate(request["devices"]):
        if "mig" not in item:
            continue
        where = f"devices[{i}].mig"
        spec = item["mig"]
        gpu = _gpu(inventory, spec["gpu"], where)
        if gpu.mig is None:
            raise StateError(f"{where}: GPU {gpu.index} ({gpu.name}) is not MIG capable")
        if not (gpu.mig.enabled and gpu.mig.pending):
            raise StateError(f"{where}: MIG is not enabled on GPU {gpu.index}",
                             hint="enable it first (a layout with mig-enabled: true)")
        profile = next((p for p in gpu.mig.profiles if p.name == spec["profile"]), None)
        if profile is None:
            raise UsageError(f"{where}.profile: GPU {gpu.index} has no MIG profile {spec['profile']!r}",
                             hint=f"profiles: {', '.join(p.name for p in gpu.mig.profiles)}")
        placement = next((pl for pl in profile.placements if pl.start == spec["start"]), None)
        if placement is None:
            raise UsageError(f"{where}.start: {profile.name} cannot start at memory slice {spec['start']} on GPU "
                             f"{gpu.index}", hint=f"its placements start at "
                             f"{', '.join(str(pl.start) for pl in profile.placements)}")
        mine = by_gpu.setdefault(gpu.uuid, [])
        taken = [*Layout.of(gpu).gis, *mine]
        span = set(range(placement.start, placement.start + placement.size))
        clash = next((g for g in taken if span & set(range(g.start, g.start + g.size))), None)
        if clash is not None:
            raise NoRoom(f"{where}: memory slices {placement.start}-{placement.start + placement.size - 1} of GPU "
                         f"{gpu.index} are held by {clash.describe()}", gpu=gpu.uuid, profile=profile.name,
                         start=placement.start)
        geometry = Geometry.of(mig_profiles(gpu))
        why = budget_error(geometry, [geometry.profile(g.profile_id) for g in taken] + [profile])
        if why:
            raise NoRoom(f"{where}: GPU {gpu.index} cannot hold a {profile.name} beside its instances: {why}",
                         gpu=gpu.uuid, profile=profile.name, start=placement.start)
        cis, _ = pack_compute_instances((profile.slices,), profile.slices)
        gi = GiLayout(placement.start, placement.size, profile.id, profile.name, profile.slices, cis)
        mine.append(gi)
        wanted.append(Wanted(i, gpu, gi))
    plans = []
    for g in inventory.gpus:
        if g.uuid in by_gpu:
            before = Layout.of(g)
            after = Layout(before.enabled, before.pending, tuple(sorted((*before.gis, *by_gpu[g.uuid]))))
            plans.append(diff(g, before, after, reset_needed=False))
    return wanted, MigPlan(config=f"make for {request['id']}", gpus=tuple(plans))


def make(host, alloc_id: str, request: dict, on_layout_changed) -> list[dict]:
    """Worker, under the node lock: make the request's MIG devices; their records (uuid, GPU,
    profile, start), in the order of its items. Journaled first; nothing is left made when
    it fails."""
    from ..devices import read_inventory
    from ..mig.executor import execute
    from .migops import created_instance
    inventory = read_inventory(host)
    wanted, plan = plan_made(inventory, request)
    _journal(host, alloc_id, [{"gpu": w.gpu.uuid, "profile": w.gi.profile, "start": w.gi.start} for w in wanted])
    try:
        execute(host, inventory, plan, on_layout_changed=on_layout_changed)
    except BaseException:
        journal_path(host).unlink(missing_ok=True)       # rolled back by the executor
        raise
    fresh = read_inventory(host)
    made = []
    for w in wanted:
        dev = created_instance(fresh, w.gpu.index, w.gi)
        if dev is None:
            unmake(host, made, on_layout_changed)
            done(host)
            raise StateError(f"the MIG device made on GPU {w.gpu.index} at {w.gi.placement} is not in the inventory")
        made.append(w.record(dev.uuid))
    return made


def _removal(inventory: Inventory, made: list[dict]) -> MigPlan:
    """The plan destroying the GPU instances of ``made`` that are still there (by placement
    and profile on their GPU)."""
    plans = []
    by_gpu: dict[str, set[tuple[str, int]]] = {}
    for m in made:
        by_gpu.setdefault(m["gpu"], set()).add((m["profile"], m["start"]))
    for g in inventory.gpus:
        gone = by_gpu.get(g.uuid)
        if not gone or g.mig is None:
            continue
        before = Layout.of(g)
        after = Layout(before.enabled, before.pending,
                       tuple(gi for gi in before.gis if (gi.profile, gi.start) not in gone))
        if after != before:
            plans.append(diff(g, before, after, reset_needed=False))
    return MigPlan(config="destroy made MIG devices", gpus=tuple(plans))


def unmake(host, made: list[dict], on_layout_changed, force: bool = False) -> None:
    """Worker, under the node lock: destroy the MIG devices ``made`` (those still there)."""
    if not made:
        return
    from ..devices import read_inventory
    from ..mig.executor import execute
    inventory = read_inventory(host)
    execute(host, inventory, _removal(inventory, made), force=force, on_layout_changed=on_layout_changed)


def check_idle(host, made: list[dict]) -> None:
    """Worker, under the node lock: InUse when processes use one of the MIG devices ``made``
    (nothing is changed: their allocations stay)."""
    from ..devices import read_inventory
    from ..mig.runner import refuse_busy
    refuse_busy(host, _removal(read_inventory(host), made),
                hint="stop those processes (the claim's pods), then release it again")


def _releasing(host) -> list[dict]:
    """The releasing record's devices, each with the ``id`` of the allocation it was made for."""
    try:
        return [dict(m) for m in json.loads((host.state_dir / RELEASING).read_text())["made"]]
    except FileNotFoundError:
        return []


def _write_releasing(host, made: list[dict]) -> None:
    from ..fileio import ensure_dir
    path = host.state_dir / RELEASING
    if not made:
        path.unlink(missing_ok=True)
        return
    ensure_dir(path.parent, 0o755)
    write_atomic(path, json.dumps({"made": made}, sort_keys=True) + "\n", mode=0o600)


def releasing(host, allocs) -> list[dict]:
    """Before the commit that drops ``allocs``: the MIG devices made for them, to destroy
    once it is done (at the next start if nothing does it first), added to those of earlier
    releases not destroyed yet. Every device the record now holds."""
    made = _releasing(host)
    known = {(m["gpu"], m["profile"], m["start"]) for m in made}
    made += [{**m, "id": a.id} for a in allocs for m in a.made if (m["gpu"], m["profile"], m["start"]) not in known]
    _write_releasing(host, made)
    return made


def not_released(host, allocs) -> None:
    """The commit dropping ``allocs`` failed: their devices stay theirs (those of earlier
    releases stay recorded)."""
    ids = {a.id for a in allocs}
    _write_releasing(host, [m for m in _releasing(host) if m["id"] not in ids])


def released(host) -> None:
    """Every device the releasing record holds is destroyed: nothing left to do."""
    _write_releasing(host, [])


def _journal(host, alloc_id: str, made: list[dict]) -> None:
    from ..fileio import ensure_dir
    path = journal_path(host)
    ensure_dir(path.parent, 0o755)
    write_atomic(path, json.dumps({"id": alloc_id, "made": made}, sort_keys=True) + "\n", mode=0o600)


def done(host) -> None:
    """The allocation is committed (or given up): nothing to undo at the next start."""
    journal_path(host).unlink(missing_ok=True)


def recover(host, kept, on_layout_changed, held: frozenset | None = frozenset()) -> list[str]:
    """Worker, at start, under the node lock: what a crash left between making an
    allocation's MIG devices and its commit (the making journal), or between a release's
    commit and the destruction of its devices (the releasing one): those devices destroyed
    (none that a kept allocation holds). ``held``: the devices unreadable checkpoint records
    may hold (None: any); a journal naming one is kept, its devices left, until an admin
    dismisses the records. What was done."""
    notes = []
    for path, committed in ((journal_path(host), False), (host.state_dir / RELEASING, True)):
        note = _settle(host, path, committed, kept, held, on_layout_changed)
        if note:
            notes.append(note)
    return notes


def _settle(host, path, releasing: bool, kept, held, on_layout_changed) -> str | None:
    try:
        raw = json.loads(path.read_text())
        made = [{k: m[k] for k in ("gpu", "profile", "start", "id")} if releasing else
                {"id": raw["id"], **{k: m[k] for k in ("gpu", "profile", "start")}} for m in raw.get("made") or ()]
        ids = sorted({m["id"] for m in made}) if releasing else [raw["id"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(path, aside)
        except OSError:
            aside = path
        log.error("MIG journal %s cannot be read (%s): kept as %s; the MIG devices it named, if any, are left "
                  "as they are (hostagent mig status shows them)", path, e, aside)
        return f"unreadable journal {path} set aside as {aside}"
    what = f"MIG devices {'of released allocation(s)' if releasing else 'made for'} {', '.join(map(str, ids))}"
    # A making journal that outlived its commit; a release whose commit did not happen.
    made = [m for m in made if not any(a.id == m["id"] for a in kept)]
    if not made:
        path.unlink(missing_ok=True)
        return None
    if held is None or any(m["gpu"] in held for m in made):
        return f"{what} left as they are: an unreadable checkpoint record may hold them (until it is dismissed)"
    taken = {(m["gpu"], m["profile"], m["start"]) for a in kept for m in a.made}
    orphans = [m for m in made if (m["gpu"], m["profile"], m["start"]) not in taken]
    try:
        unmake(host, orphans, on_layout_changed, force=True)
    except HostagentError as e:
        if releasing:                    # committed: tried again at the next start
            return f"{what} not destroyed: {e.message} (tried again at the next start)"
        path.unlink(missing_ok=True)
        return f"{what} not destroyed: {e.message}"
    path.unlink(missing_ok=True)
    return f"{what} {'destroyed after' if releasing else 'before'} a crash{'' if releasing else ' destroyed'} " \
           f"({len(orphans)})"
