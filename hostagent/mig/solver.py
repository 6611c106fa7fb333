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
from dataclasses import dataclass

from ..devices.records import MigProfile
from .layout import CiLayout, GiLayout
from .profiles import ci_name, ci_shapes

__all__ = ["Geometry", "Infeasible", "solve", "pack_compute_instances"]

ENGINES = ("decoders", "encoders", "jpegs", "ofas")
_ENGINE_NAMES = {"decoders": "decoders", "encoders": "encoders", "jpegs": "JPEG engines",
                 "ofas": "OFA engines"}
_MAX_COMBINATIONS = 500       # GPU-instance groupings tried per request (CI forms only)


class Infeasible(ValueError):
    """The request cannot be laid out on this GPU; the message says which profiles clash."""


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


def _groupings(sizes: tuple[int, ...], gi_slices: int, max_groups: int) -> list[tuple[tuple[int, ...], ...]]:
    """Ways to split requested compute instances of one GI profile into GPU instances."""
    out: set = set()

    def rec(rest: tuple[int, ...], groups: tuple):
        if len(groups) > max_groups:
            return
        if not rest:
            out.add(tuple(sorted(groups, reverse=True)))
            return
        first, others = rest[0], rest[1:]
        seen = set()
        for r in range(len(others) + 1):
            for idx in itertools.combinations(range(len(others)), r):
                group = tuple(sorted((first,) + tuple(others[i] for i in idx), reverse=True))
                if group in seen or _pack_fresh(group, gi_slices) is None:
                    continue
                seen.add(group)
                remaining = tuple(others[i] for i in range(len(others)) if i not in idx)
                rec(remaining, groups + (group,))

    rec(tuple(sorted(sizes, reverse=True)), ())
    return sorted(out, key=lambda g: (len(g), g))


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
           bound: float) -> tuple[int, tuple[GiLayout, ...]] | None:
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


def _fits(geo: Geometry, items) -> bool:
    return budget_error(geo, [p for p, _ in items]) is None and _place(geo, items, {}, float("inf")) is not None


def _explain(geo: Geometry, items) -> str:
    """The smallest subset of ``items`` that still cannot fit, and why."""
    core = list(items)
    for it in list(core):
        trial = list(core)
        trial.remove(it)
        if trial and not _fits(geo, trial):
            core = trial
    profiles = [p for p, _ in core]
    names = {}
    for p in profiles:
        names[p.name] = names.get(p.name, 0) + 1
    what = " + ".join(f"{n}x {name}" for name, n in names.items())
    why = budget_error(geo, profiles) or "no arrangement of their memory-slice placements avoids overlap"
    return f"{what} cannot fit together: {why}"


def solve(geo: Geometry, request: dict[int, list[int]],
          current: tuple[GiLayout, ...] = ()) -> tuple[GiLayout, ...]:
    """Lay out ``request`` (GI profile id -> compute-instance slice counts) on a GPU whose
    existing instances are ``current``; raises Infeasible with the reason."""
    existing = {gi.key: gi for gi in current}
    per_profile = []
    for pid, sizes in sorted(request.items()):
        if not sizes:
            continue
        p = geo.profile(pid)
        groupings = _groupings(tuple(sizes), p.slices, p.instances)
        if not groupings:
            names = " + ".join(f"{sizes.count(c)}x {ci_name(c, p.slices, p.name)}"
                               for c in sorted(set(sizes), reverse=True))
            raise Infeasible(f"{names} need more than the {p.instances} {p.name} GPU "
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
        found = _place(geo, items, existing, best[0] if best else float("inf"))
        if found:
            best = found
    if best is None:
        raise Infeasible(_explain(geo, fewest or []))
    return best[1]
