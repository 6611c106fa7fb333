"""The MIG creation rules stated on their own, to check the simulator against.

Written from the reference rules (mig.md §3.1, §3.9, §4, §6), not from the simulator's
code: given a GPU's profile table and the instances that exist, say whether a create must
succeed (and where the instance lands) or which NVML error it must return. Memory slices
are bit masks here, the compute-instance table is the reference's, so a shared mistake
would have to be made twice, differently.
"""

from __future__ import annotations

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
    the simulator's documented choice is the highest free one (docs/simulator.md).
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
    return (SUCCESS, max(free)) if free else (FULL, None)


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
