"""MIG devices made for allocations: a GPU instance of a profile at exactly the placement an
allocation names (a DRA claim's partition), with one compute instance spanning it, destroyed
when the allocation is released.

``plan_made`` is pure: it refuses what the GPU cannot take there (MIG not enabled, a
placement the profile does not have, slices another instance holds, more than the GPU's
compute slices or engines allow beside its instances) and plans every GPU's additions as one
MIG plan each, for the MIG package's executor (all or nothing, rolled back on failure).
``make`` records its intent in a journal before it touches the node, so that a crash before
the allocation's commit is undone at the next start (``recover``); the allocator removes the
journal once the checkpoint holds the allocation (``done``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ..devices.records import Gpu, Inventory
from ..errors import HostagentError, StateError, UsageError
from ..fileio import write_atomic
from ..mig.layout import GiLayout, Layout
from ..mig.plan import MigPlan, diff
from ..mig.quirks import mig_profiles
from ..mig.solver import Geometry, budget_error, pack_compute_instances
from .migops import NoRoom

__all__ = ["Wanted", "plan_made", "make", "unmake", "done", "recover", "journal_path"]

log = logging.getLogger("hostagent.daemon")

JOURNAL = "allocation-making.json"


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


def _journal(host, alloc_id: str, made: list[dict]) -> None:
    from ..fileio import ensure_dir
    path = journal_path(host)
    ensure_dir(path.parent, 0o755)
    write_atomic(path, json.dumps({"id": alloc_id, "made": made}, sort_keys=True) + "\n", mode=0o600)


def done(host) -> None:
    """The allocation is committed (or given up): nothing to undo at the next start."""
    journal_path(host).unlink(missing_ok=True)


def recover(host, kept, on_layout_changed) -> str | None:
    """Worker, at start, under the node lock: a journal left by a crash between making an
    allocation's MIG devices and its commit: destroy those devices (none that a kept
    allocation holds). What was done, or None."""
    path = journal_path(host)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        path.unlink(missing_ok=True)
        return f"unreadable journal {path} removed: {e}"
    if any(a.id == raw.get("id") for a in kept):
        done(host)                       # the commit happened: the journal outlived it
        return None
    held = {(m["gpu"], m["profile"], m["start"]) for a in kept for m in a.made}
    orphans = [m for m in raw.get("made") or [] if (m["gpu"], m["profile"], m["start"]) not in held]
    try:
        unmake(host, orphans, on_layout_changed, force=True)
    except HostagentError as e:
        return f"MIG devices made for {raw.get('id')} not destroyed: {e.message}"
    finally:
        done(host)
    return f"MIG devices made for {raw.get('id')} before a crash destroyed ({len(orphans)})"
