"""Exact placement solving for one GPU: which GPU instances, where, and which compute
instances inside each, so a requested set of MIG devices fits and as many existing
instances as possible stay.

The driver's rules, as the planner must respect them before touching anything:
memory-slice placements may not overlap; compute slices, per-profile instance counts and
media engines (decoders, encoders, JPEG, OFA) are budgets of the whole GPU; a ``+me.all``
instance allows only ``-me`` instances beside it; compute instances pack on their GPU
instance's compute-slice axis. The search is exhaustive (the spaces are tiny: at most 8
memory slices and 7 compute slices), so a feasible request always gets a layout and an
infeasible one gets the smallest set of profiles that cannot fit together.

Cost = GPU and compute instances destroyed plus created; the least-cost layout wins, so a
layout that already satisfies the request costs nothing and an unchanged instance is kept.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass

from ..devices.records import MigProfile
from .layout import CiLayout, GiLayout
from .profiles import ci_name, ci_shapes

__all__ = ["Geometry", "Infeasible", "SearchAborted", "Budget", "solve", "pack_compute_instances"]

ENGINES = ("decoders", "encoders", "jpegs", "ofas")
_ENGINE_NAMES = {"decoders": "decoders", "encoders": "encoders", "jpegs": "JPEG engines",
                 "ofas": "OFA engines"}
_MAX_COMBINATIONS = 500       # GPU-instance groupings tried per request (CI forms only)


class Infeasible(ValueError):
    """The request cannot be laid out on this GPU; the message says which profiles clash."""


class SearchAborted(ValueError):
    """The search ran out of its time budget, or its caller asked it to stop."""


class Budget:
    """What one planner call may spend: a deadline and a stop flag, checked inside every
    search loop (cheaply: the clock is read once per 256 steps). ``steps`` counts the work
    done, so tests can bound it without timing anything."""

    def __init__(self, seconds: float | None = None, stop_requested=None):
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.stop_requested = stop_requested
        self.steps = 0

    def check(self) -> None:
        self.steps += 1
        if self.steps & 255 and self.steps != 1:
            return
        if self.stop_requested is not None and self.stop_requested():
            raise SearchAborted("the layout search was stopped (the agent is shutting down)")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SearchAborted(f"the layout search took longer than its {self.seconds:g} s budget; "
                                "ask for fewer or simpler instances")


@dataclass(frozen=True)
class Geometry:
    """A GPU's MIG capacity, derived from its profile table (the whole-GPU profile holds it)."""
    memory_slices: int
    compute_slices: int
    engines: tuple[int, int, int, int]
    profiles: tuple[MigProfile, ...]

    @classmethod
    def of(cls, profiles: tuple[MigProfile, ...]) -> "Geometry":
        """``profiles`` is not empty: callers handle a GPU that lists none (some drivers list
        them only while MIG is enabled) before solving."""
        full = max(profiles, key=lambda p: (p.memory_slices, p.slices))
        memory = max(pl.start + pl.size for p in profiles for pl in p.placements)
        return cls(memory, full.slices, tuple(getattr(full, e) for e in ENGINES), tuple(profiles))

    def profile(self, profile_id: int) -> MigProfile:
        return next(p for p in self.profiles if p.id == profile_id)


def _all_media(p: MigProfile) -> bool:
    return p.name.endswith("+me.all")


def _no_media(p: MigProfile) -> bool:
    return p.name.endswith("-me")


# ---- compute instances inside one GPU instance -----------------------------------------

def pack_compute_instances(sizes: tuple[int, ...], gi_slices: int,
                           prefer: tuple[CiLayout, ...] = ()) -> tuple[tuple[CiLayout, ...], int] | None:
    """Placements for compute instances of these slice counts in a ``gi_slices`` instance,
    keeping as many of ``prefer`` (existing ones) as possible; (layout, kept) or None."""
    if not prefer:
        return _pack_fresh(tuple(sorted(sizes, reverse=True)), gi_slices)
    return _pack(tuple(sorted(sizes, reverse=True)), gi_slices, frozenset((c.start, c.slices) for c in prefer))


@functools.lru_cache(maxsize=4096)
def _pack_fresh(sizes: tuple[int, ...], gi_slices: int):
    return _pack(sizes, gi_slices, frozenset())


def _pack(sizes, gi_slices, prefer):
    shapes = {s.slices: s for s in ci_shapes(gi_slices)}
    if any(c not in shapes for c in sizes) or sum(sizes) > gi_slices:
        return None
    best: list = []

    def dfs(i, used, chosen, kept, last_start):
        if best and (best[1] == len(sizes) or not prefer):
            return
        if i == len(sizes):
            if not best or kept > best[1]:
                best[:] = [tuple(sorted(chosen)), kept]
            return
        c = sizes[i]
        floor = last_start if i and sizes[i - 1] == c else -1   # identical CIs: one order only
        for start in shapes[c].starts:
            mask = ((1 << c) - 1) << start
            if start <= floor or used & mask:
                continue
            dfs(i + 1, used | mask, chosen + [CiLayout(start, c, shapes[c].profile_id)],
                kept + ((start, c) in prefer), start)

    dfs(0, 0, [], 0, -1)
    return (best[0], best[1]) if best else None


def _packable_groups(kinds: tuple[int, ...], gi_slices: int) -> list[tuple[int, ...]]:
    """Every multiset of compute-instance sizes (drawn from ``kinds``) that one GPU
    instance of ``gi_slices`` can hold, largest first. A handful: at most 8 slices."""
    out = []

    def rec(i: int, group: tuple[int, ...], room: int):
        if group and _pack_fresh(group, gi_slices) is not None:
            out.append(group)
        for j in range(i, len(kinds)):
            if kinds[j] <= room:
                rec(j, group + (kinds[j],), room - kinds[j])

    rec(0, (), gi_slices)
    return out


def _groupings(sizes: tuple[int, ...], gi_slices: int, max_groups: int,
               budget: "Budget | None" = None) -> list[tuple[tuple[int, ...], ...]]:
    """Ways to split requested compute instances of one GI profile into at most
    ``max_groups`` GPU instances. Groups are chosen as multisets of sizes, never as index
    subsets, so the work depends on how many distinct groups exist (few), not on how many
    instances are asked for; a request that needs more slices than ``max_groups``
    instances hold is refused before any search."""
    if sum(sizes) > max_groups * gi_slices:
        return []
    kinds = tuple(sorted(set(sizes), reverse=True))
    need = tuple(sizes.count(k) for k in kinds)
    groups = [(g, tuple(g.count(k) for k in kinds)) for g in _packable_groups(kinds, gi_slices)]
    out: list = []

    def rec(start: int, remaining: tuple[int, ...], chosen: tuple):
        if budget is not None:
            budget.check()
        if not any(remaining):
            out.append(chosen)
            return
        left = max_groups - len(chosen)
        if left == 0 or sum(r * k for r, k in zip(remaining, kinds)) > left * gi_slices:
            return
        for j in range(start, len(groups)):           # non-decreasing: each multiset once
            group, counts = groups[j]
            if all(c <= r for c, r in zip(counts, remaining)):
                rec(j, tuple(r - c for r, c in zip(remaining, counts)), chosen + (group,))

    rec(0, need, ())
    return sorted({tuple(sorted(g, reverse=True)) for g in out}, key=lambda g: (len(g), g))


# ---- GPU-wide budgets ------------------------------------------------------------------

def budget_error(geo: Geometry, profiles: list[MigProfile]) -> str | None:
    """Why these GPU instances cannot coexist whatever their placements; None if they may."""
    for p in {p.id: p for p in profiles}.values():
        n = sum(q.id == p.id for q in profiles)
        if n > p.instances:
            return f"{p.name} allows at most {p.instances} instance{'s' * (p.instances != 1)}, not {n}"
    compute = sum(p.slices for p in profiles)
    if compute > geo.compute_slices:
        return f"they need {compute} compute slices, the GPU has {geo.compute_slices}"
    memory = sum(p.memory_slices for p in profiles)
    if memory > geo.memory_slices:
        return f"they need {memory} memory slices, the GPU has {geo.memory_slices}"
    for i, engine in enumerate(ENGINES):
        need = sum(getattr(p, engine) for p in profiles)
        if need > geo.engines[i]:
            return f"they need {need} {_ENGINE_NAMES[engine]}, the GPU has {geo.engines[i]}"
    if any(_all_media(p) for p in profiles) and any(not _no_media(p) for p in profiles if not _all_media(p)):
        return "a +me.all instance allows only -me instances beside it"
    if sum(_all_media(p) for p in profiles) > 1:
        return "a +me.all instance allows only -me instances beside it"
    return None


# ---- placements ------------------------------------------------------------------------

@dataclass(frozen=True)
class _Option:
    start: int
    mask: int
    cost: int
    cis: tuple[CiLayout, ...]


def _options(p: MigProfile, group: tuple[int, ...], existing: dict) -> list[_Option]:
    out = []
    for pl in p.placements:
        mask = ((1 << pl.size) - 1) << pl.start
        old = existing.get((p.id, pl.start))
        if old is not None:
            cis, kept = pack_compute_instances(group, p.slices, old.cis)
            # Keeping saves the old instance's destruction; only differing CIs change.
            cost = (len(old.cis) - kept) + (len(group) - kept) - (1 + len(old.cis))
        else:
            cis, _ = _pack_fresh(group, p.slices)
            cost = 1 + len(group)
        out.append(_Option(pl.start, mask, cost, cis))
    return sorted(out, key=lambda o: (o.cost, o.start))


def _place(geo: Geometry, items: list[tuple[MigProfile, tuple[int, ...]]], existing: dict,
           bound: float, budget: Budget | None = None) -> tuple[int, tuple[GiLayout, ...]] | None:
    """Least-cost non-overlapping placements for ``items``, if any beats ``bound``."""
    items = sorted(items, key=lambda it: (-it[0].memory_slices, it[0].id, it[1]))
    options = [_options(p, g, existing) for p, g in items]
    floor = [0] * (len(items) + 1)
    for i in range(len(items) - 1, -1, -1):
        floor[i] = floor[i + 1] + min((o.cost for o in options[i]), default=0)
    base = sum(1 + len(gi.cis) for gi in existing.values())
    best: list = []
    limit = [bound]

    def dfs(i, used, cost, chosen, last_start):
        if budget is not None:
            budget.check()
        if base + cost + floor[i] >= limit[0]:
            return
        if i == len(items):
            best[:] = [base + cost, tuple(chosen)]
            limit[0] = base + cost
            return
        same = i and items[i - 1] == items[i]
        for opt in options[i]:
            if used & opt.mask or (same and opt.start <= last_start):
                continue
            p = items[i][0]
            gi = GiLayout(opt.start, p.placements[0].size, p.id, p.name, p.slices, opt.cis)
            dfs(i + 1, used | opt.mask, cost + opt.cost, chosen + [gi], opt.start)

    dfs(0, 0, 0, [], -1)
    return (best[0], tuple(sorted(best[1]))) if best else None


def _fits(geo: Geometry, items, budget: Budget | None) -> bool:
    return budget_error(geo, [p for p, _ in items]) is None and \
        _place(geo, items, {}, float("inf"), budget) is not None


def _explain(geo: Geometry, items, budget: Budget | None = None) -> str:
    """The smallest subset of ``items`` that still cannot fit, and why."""
    core = list(items)
    for it in list(core):
        trial = list(core)
        trial.remove(it)
        if trial and not _fits(geo, trial, budget):
            core = trial
    profiles = [p for p, _ in core]
    names = {}
    for p in profiles:
        names[p.name] = names.get(p.name, 0) + 1
    what = " + ".join(f"{n}x {name}" for name, n in names.items())
    why = budget_error(geo, profiles) or "no arrangement of their memory-slice placements avoids overlap"
    return f"{what} cannot fit together: {why}"


def _names(p: MigProfile, sizes: list[int]) -> str:
    return " + ".join(f"{sizes.count(c)}x {ci_name(c, p.slices, p.name)}"
                      for c in sorted(set(sizes), reverse=True))


def _capacity_error(geo: Geometry, request: dict[int, list[int]]) -> str | None:
    """Why ``request`` cannot fit whatever the grouping and placements, judged from the
    fewest GPU instances each profile needs (its compute slices over the instance's);
    None if it may fit. Cheap, so every request is checked before any search."""
    fewest: list[MigProfile] = []
    for pid, sizes in sorted(request.items()):
        if not sizes:
            continue
        p = geo.profile(pid)
        needed = -(-sum(sizes) // p.slices)
        if needed > p.instances:
            return (f"{_names(p, sizes)} need more than the {p.instances} {p.name} GPU "
                    f"instance{'s' * (p.instances != 1)} the GPU allows")
        fewest += [p] * needed
    why = budget_error(geo, fewest)
    if why is None:
        return None
    asked = " + ".join(_names(geo.profile(pid), sizes) for pid, sizes in sorted(request.items()) if sizes)
    return f"{asked} cannot fit together: {why}"


def solve(geo: Geometry, request: dict[int, list[int]],
          current: tuple[GiLayout, ...] = (), budget: Budget | None = None) -> tuple[GiLayout, ...]:
    """Lay out ``request`` (GI profile id -> compute-instance slice counts) on a GPU whose
    existing instances are ``current``; raises Infeasible with the reason, SearchAborted
    when ``budget`` runs out. What cannot fit by capacity alone is refused before any
    search; the search itself is bounded by the GPU's size, not by the request's."""
    why = _capacity_error(geo, request)
    if why:
        raise Infeasible(why)
    existing = {gi.key: gi for gi in current}
    per_profile = []
    for pid, sizes in sorted(request.items()):
        if not sizes:
            continue
        p = geo.profile(pid)
        groupings = _groupings(tuple(sizes), p.slices, p.instances, budget)
        if not groupings:
            raise Infeasible(f"{_names(p, sizes)} need more than the {p.instances} {p.name} GPU "
                             f"instance{'s' * (p.instances != 1)} the GPU allows")
        per_profile.append((p, groupings))

    best: tuple[int, tuple[GiLayout, ...]] | None = None
    fewest = None
    combos = itertools.islice(itertools.product(*[g for _, g in per_profile]), _MAX_COMBINATIONS)
    for combo in sorted(combos, key=lambda c: sum(len(g) for g in c)):
        items = [(p, group) for (p, _), groups in zip(per_profile, combo) for group in groups]
        if fewest is None:
            fewest = items
        if budget_error(geo, [p for p, _ in items]):
            continue
        found = _place(geo, items, existing, best[0] if best else float("inf"), budget)
        if found:
            best = found
    if best is None:
        raise Infeasible(_explain(geo, fewest or [], budget))
    return best[1]
