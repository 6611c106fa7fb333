"""The MIG creation rules stated on their own, to check the simulator against.

Written from the reference rules (mig.md §3.1, §3.9, §4, §6), not from the simulator's
code: given a GPU's profile table and the instances that exist, say whether a create must
succeed (and where the instance lands) or which NVML error it must return. Memory slices
are bit masks here, the compute-instance table is the reference's, so a shared mistake
would have to be made twice, differently.
"""

from __future__ import annotations

from typing import NamedTuple

import pynvml as N

SUCCESS = N.NVML_SUCCESS
BAD = N.NVML_ERROR_INVALID_ARGUMENT
FULL = N.NVML_ERROR_INSUFFICIENT_RESOURCES
UNSUPPORTED = N.NVML_ERROR_NOT_SUPPORTED
IN_USE = N.NVML_ERROR_IN_USE

# mig.md §3.9: compute slices of each NVML_COMPUTE_INSTANCE_PROFILE_* value ...
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
# ... and how many CIs of C slices a G-slice GPU instance allows.
CI_TABLE = {1: {1: 1}, 2: {1: 2, 2: 1}, 3: {1: 3, 2: 1, 3: 1}, 4: {1: 4, 2: 2, 4: 1},
            7: {1: 7, 2: 3, 3: 2, 4: 1, 7: 1}}


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def gi_create(mig, existing, profile_id, placement=None):
    """(expected NVML code, start of the new GPU instance or None).

    ``existing``: (profile id, start) of the GPU instances that exist. Without a placement
    the simulator's documented choice is the free start leaving the most (profile,
    placement) pairs unoccupied, the lowest of equals (docs/simulator.md).
    """
    prof = next((p for p in mig.gi_profiles if p.id == profile_id), None)
    if prof is None:
        return BAD, None
    if placement is not None and (placement[1] != prof.memory_slices
                                  or placement[0] not in prof.placements):
        return BAD, None
    by_id = {p.id: p for p in mig.gi_profiles}
    have = [by_id[pid] for pid, _ in existing]
    occupied = 0
    for pid, start in existing:
        occupied |= _mask(start, by_id[pid].memory_slices)
    if sum(p.id == prof.id for p in have) >= prof.instances:          # instanceCount
        return FULL, None
    if sum(p.slices for p in have) + prof.slices > mig.compute_slices:  # 7 (A30: 4) SM slices
        return FULL, None
    if "+me" in prof.name and any("+me" in p.name for p in have):       # one media extension
        return FULL, None
    free = [s for s in prof.placements if not occupied & _mask(s, prof.memory_slices)]
    if placement is not None:
        return (SUCCESS, placement[0]) if placement[0] in free else (FULL, None)
    if not free:
        return FULL, None

    def left_open(start):
        taken = occupied | _mask(start, prof.memory_slices)
        return sum(not taken & _mask(s, p.memory_slices) for p in mig.gi_profiles for s in p.placements)
    best = max(left_open(s) for s in free)
    return SUCCESS, min(s for s in free if left_open(s) == best)


def ci_create(gi_slices, existing, profile_id, placement=None):
    """(expected NVML code, start of the new compute instance or None) in a GPU instance
    of ``gi_slices`` compute slices; ``existing``: (profile id, start) of its CIs. CIs of C
    slices are placed at multiples of C, the lowest free one without a placement."""
    c = CI_SLICES.get(profile_id)
    allowed = CI_TABLE[gi_slices]
    if c not in allowed:
        return UNSUPPORTED, None
    starts = [k * c for k in range(allowed[c])]
    if placement is not None and (placement[1] != c or placement[0] not in starts):
        return BAD, None
    if sum(pid == profile_id for pid, _ in existing) >= allowed[c]:
        return FULL, None
    occupied = 0
    for pid, start in existing:
        occupied |= _mask(start, CI_SLICES[pid])
    if bin(occupied).count("1") + c > gi_slices:
        return FULL, None
    free = [s for s in starts if not occupied & _mask(s, c)]
    if placement is not None:
        return (SUCCESS, placement[0]) if placement[0] in free else (FULL, None)
    return (SUCCESS, min(free)) if free else (FULL, None)


def destroy(has_compute_instances: bool, has_processes: bool):
    """GPU instances: IN_USE while CIs or processes exist; CIs: while processes exist."""
    return IN_USE if has_compute_instances or has_processes else SUCCESS


# ---- the property tests' random ops, decoded once for both ------------------------------
#
# A GPU's instances as the tests read them (from the node model, or back through NVML):
# GPU instances as (id, profile id, start, size, CIs), CIs as (id, profile id, start, size).

class Expected(NamedTuple):
    """What an op stands for and what the rules say it must do. ``kind``: "gi" or "ci"
    (create, with ``profile`` and ``placement``), "dgi" or "dci" (destroy); ``gi`` and ``ci``
    are positions in the list of instances given (the GI created in, or destroyed; the CI
    destroyed). ``after``: the instances once it succeeds, as ``instances`` gives them."""
    kind: str
    profile: int | None
    placement: tuple[int, int] | None
    gi: int | None
    ci: int | None
    want: int
    after: set


def instances(gis) -> set:
    """The instances without the GPU instances' handles or order: ("gi", profile, start,
    size) and ("ci", gi id, profile, start, size)."""
    out = set()
    for gi_id, profile_id, start, size, cis in gis:
        out.add(("gi", profile_id, start, size))
        out.update(("ci", gi_id, *ci[1:]) for ci in cis)
    return out


def expect(mig, gis, busy, op, a, b, c) -> Expected | None:
    """The call random op ``(op, a, b, c)`` stands for on a GPU with GPU instances ``gis``
    and processes in the (gi, ci) pairs ``busy``; None when it stands for none ("hold" and
    "free" are the tests' own, as is any op on instances that do not exist)."""
    now = instances(gis)
    if op in ("gi", "gi_at"):
        prof = mig.gi_profiles[a % len(mig.gi_profiles)]
        placement = None
        if op == "gi_at":     # mostly a placement the profile lists, sometimes any numbers
            placement = ((prof.placements[b % len(prof.placements)], prof.memory_slices)
                         if c % 4 else (b, c))
        want, start = gi_create(mig, [(g[1], g[2]) for g in gis], prof.id, placement)
        return Expected("gi", prof.id, placement, None, None, want,
                        now | {("gi", prof.id, start, prof.memory_slices)})
    if not gis:
        return None
    at = b % len(gis)
    gi_id, gi_profile, gi_start, gi_size, cis = gis[at]
    if op in ("ci", "ci_at"):
        pid = a % N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT    # every id, those that cannot fit too
        size = CI_SLICES.get(pid, 1)
        placement = ((size * (c % 7), size) if c % 4 else (c, b)) if op == "ci_at" else None
        gi_slices = next(p.slices for p in mig.gi_profiles if p.id == gi_profile)
        want, start = ci_create(gi_slices, [(ci[1], ci[2]) for ci in cis], pid, placement)
        return Expected("ci", pid, placement, at, None, want, now | {("ci", gi_id, pid, start, size)})
    if op == "dgi":
        want = destroy(bool(cis), any(g == gi_id for g, _ in busy))
        return Expected("dgi", None, None, at, None, want, now - {("gi", gi_profile, gi_start, gi_size)})
    if op == "dci" and cis:
        ci_at = c % len(cis)
        ci_id, *ci_rest = cis[ci_at]
        want = destroy(False, (gi_id, ci_id) in busy)
        return Expected("dci", None, None, at, ci_at, want, now - {("ci", gi_id, *ci_rest)})
    return None
