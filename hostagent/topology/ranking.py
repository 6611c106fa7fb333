"""Which set of GPUs is best connected: NVIDIA go-gpuallocator's best-effort policy, then
NUMA, then the caller's own tie-breaks.

A pair of GPUs scores as go-gpuallocator's ``calculateGPUPairScore`` does: its PCIe level
(SYS 10, NODE 20, PHB 30, PXB 40, PIX 50, same board 60) plus 100 a NVLink; a set, the sum
of its pairs. The policy does not take the single best set: it divides all the offered GPUs
into sets of the size asked (the last one short, when they do not divide evenly), takes the
division with the highest total (so what is left stays well connected for the next
request), and from it the best set that holds the GPUs that must be included. Among equal
divisions the one with more sets inside a NUMA node wins, then the first in go-gpuallocator's
order; among equal sets, fewer NUMA nodes, then the caller's ranking, then the first.

The divisions are searched exactly (memoised over subsets of GPUs, kept across calls) up to
``EXACT_UP_TO`` GPUs; beyond, a set is grown greedily from the best pair.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..devices.records import UNKNOWN, Inventory

__all__ = ["Links", "PCIE_POINTS", "NVLINK_POINTS", "EXACT_UP_TO"]

PCIE_POINTS = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50, "BOARD": 60}
NVLINK_POINTS = 100
EXACT_UP_TO = 10
_MEMO_LIMIT = 200_000
_COMBINATIONS = 5000


@dataclass
class Links:
    """How one inventory's GPUs (by index) are connected, scored for allocation."""
    scores: dict[tuple[int, int], int]          # (a, b), a < b -> pair score
    numa: dict[int, int | None]
    nvlinks: dict[tuple[int, int], int] = field(default_factory=dict)   # (a, b), a < b
    codes: dict[tuple[int, int], str] = field(default_factory=dict)     # (a, b), a < b -> "NV2", "PIX"...
    roots: dict[int, str | None] = field(default_factory=dict)          # PCIe root of each GPU
    unknown: dict[int, str] = field(default_factory=dict)               # GPU -> why its links are unknown
    key: object = None             # what it was made from (key_of): the same key, the same links
    _memo: dict = field(default_factory=dict, repr=False)
    _sets: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def key_of(inventory: Inventory):
        return inventory.topology, tuple((g.index, g.numa_node, g.pcie_root) for g in inventory.gpus)

    @classmethod
    def of(cls, inventory: Inventory) -> "Links":
        topology = inventory.topology
        numa = {g.index: g.numa_node for g in inventory.gpus}
        roots = {g.index: g.pcie_root for g in inventory.gpus}
        if topology is None:
            return cls({}, numa, roots=roots, unknown={g.index: "the topology was not read" for g in inventory.gpus},
                       key=cls.key_of(inventory))
        scores, nvlinks, codes, unknown = {}, {}, {}, {}
        for g in topology.gpus:
            if g.error:
                unknown[g.index] = g.error
        placed = dict(unknown)        # GPUs NVML could not place: their own reason says it all
        for link in topology.links:
            if link.pcie == UNKNOWN or link.nvlinks is None:
                a, b = link.gpus
                if a not in placed and b not in placed:
                    unknown.setdefault(a, f"its link to GPU {b} is unknown")
                    unknown.setdefault(b, f"its link to GPU {a} is unknown")
                continue
            scores[link.gpus] = PCIE_POINTS.get(link.pcie, 0) + NVLINK_POINTS * link.nvlinks
            nvlinks[link.gpus] = link.nvlinks
            codes[link.gpus] = link.code
        return cls(scores, numa, nvlinks, codes, roots, unknown,
                   key=cls.key_of(inventory))

    # ---- pairs and sets ------------------------------------------------------------

    def score(self, a: int, b: int) -> int:
        return self.scores.get((a, b) if a < b else (b, a), 0)

    def nvlinked(self, a: int, b: int) -> bool:
        return self.nvlinks.get((a, b) if a < b else (b, a), 0) > 0

    def set_score(self, members) -> int:
        members = sorted(members)
        return sum(self.score(a, b) for i, a in enumerate(members) for b in members[i + 1:])

    def numa_nodes(self, members) -> int:
        return len({self.numa.get(i) for i in members})

    def describe(self, members) -> str:
        """``0-1 NV1, 0-2 PHB``: each pair's link in nvidia-smi's notation."""
        members = sorted(members)
        return ", ".join(f"{a}-{b} {self.codes.get((a, b), 'unknown')}"
                         for i, a in enumerate(members) for b in members[i + 1:])

    def why_unknown(self, indices) -> str | None:
        """Why the links of any of these GPUs are unknown (None: all are known)."""
        return next((f"GPU {i}: {self.unknown[i]}" for i in sorted(indices) if i in self.unknown), None)

    def warm(self, up_to: int = 8) -> None:
        """Search every division of every subset of the GPUs ahead of the first request (a
        node of ``up_to`` GPUs or fewer): a few tens of ms once per inventory instead of up
        to a millisecond at the first requests of each kind."""
        gpus = sorted(self.numa)
        if len(gpus) > up_to:
            return
        for mask in range(1, 1 << len(gpus)):
            members = [gpus[i] for i in range(len(gpus)) if mask >> i & 1]
            for size in range(2, len(members)):
                self._best_division(_mask(members), 0, size)

    # ---- the best set --------------------------------------------------------------

    def best(self, available, required, size: int, rank=None) -> tuple[int, ...] | None:
        """The best set of ``size`` of the GPUs ``available`` holding all ``required``; None
        where there is none (too few, or a required GPU not available). ``rank(set)``: the
        caller's tie-break after NUMA, lower first (default: none)."""
        available = sorted(set(available))
        required = sorted(set(required))
        if size <= 0 or size > len(available) or len(required) > size or not set(required) <= set(available):
            return None
        rank = rank or (lambda members: ())
        if size == 1:       # go-gpuallocator: each GPU is its own candidate
            candidates = [_mask([r]) for r in required] or [_mask([i]) for i in available]
        elif len(available) > EXACT_UP_TO:
            return self._greedy(available, required, size, rank)
        else:
            req = _mask(required)
            candidates = [g for g in self._division(available, required, size)
                          if g & req == req and bin(g).count("1") == size]
        # The best score on the fewest NUMA nodes; the caller's rank only among those equal.
        top = max(self._group_key(g)[::2] for g in candidates)
        tied = [_members(g) for g in candidates if self._group_key(g)[::2] == top]
        return tied[0] if len(tied) == 1 else min(tied, key=rank)

    def best_valid(self, available, size: int, valid, rank=None) -> tuple[int, ...] | None:
        """The best set of ``size`` of ``available`` for which ``valid(set)`` holds (every
        combination up to ``_COMBINATIONS``, else grown greedily); None if there is none."""
        available = sorted(set(available))
        rank = rank or (lambda members: ())
        if size > len(available):
            return None
        if math.comb(len(available), size) > _COMBINATIONS:
            sets = [s for s in [self._greedy(available, [], size, rank)] if valid(s)]
        else:
            sets = [s for s in itertools.combinations(available, size) if valid(s)]
        return max(sets, key=lambda s: (self.set_score(s), -self.numa_nodes(s), _neg(rank(s))), default=None)

    def spread(self, pools: dict[int, list], needed: int, taken=(), tiebreak=None) -> list:
        """``needed`` items of ``pools`` (GPU -> its items, in the order to take them): from
        the GPUs ``taken`` first, then from one GPU that holds the rest (the one holding the
        fewest that does), else from the GPU holding the most, each next GPU the best
        connected to those taken; ``tiebreak(gpu)`` after that, lower first."""
        pools = {g: list(items) for g, items in pools.items() if items}
        taken = set(taken)
        tiebreak = tiebreak or (lambda gpu: gpu)
        out: list = []
        while len(out) < needed and pools:
            left = needed - len(out)

            def order(gpu: int):
                fits = len(pools[gpu]) >= left
                return (gpu not in taken, not fits, -sum(self.score(gpu, t) for t in taken if t != gpu),
                        len(pools[gpu]) if fits else -len(pools[gpu]), tiebreak(gpu))
            gpu = min(pools, key=order)
            out += pools[gpu][:left]
            pools[gpu] = pools[gpu][left:]
            if not pools[gpu]:
                del pools[gpu]
            taken.add(gpu)
        return out

    def _division(self, available, required, size: int) -> list[int]:
        """The best division of ``available`` into sets of ``size`` (as masks): memoised by subset."""
        req = _mask(required)
        out, mask = [], _mask(available)
        while mask:
            _, group = self._best_division(mask, req & mask, size)
            out.append(group)
            mask &= ~group
        return out

    def _best_division(self, mask: int, req: int, size: int):
        """((total score, sets inside one NUMA node), first set) of the best division of the
        GPUs in ``mask`` into sets of ``size`` (one short set when they do not divide), where
        the GPUs in ``req`` share one full set. Candidates come in go-gpuallocator's order:
        the lowest GPU with each combination of the others, the short set's padding last."""
        key = (mask, req, size)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        reals = _members(mask)
        pad = -len(reals) % size
        if len(reals) + pad == size:
            best = (self._group_key(mask)[:2], mask) if not (req and pad) else ((-1, 0), mask)
        else:
            low, others = reals[0], reals[1:]
            best = None
            slots = [*others] + [None] * pad
            for combo in itertools.combinations(range(len(slots)), size - 1):
                nils = sum(slots[c] is None for c in combo)
                if nils not in (0, pad):
                    continue
                group = 1 << low
                for c in combo:
                    if slots[c] is not None:
                        group |= 1 << slots[c]
                if req and group & req and (group & req != req or nils):
                    continue
                rest = self._best_division(mask & ~group, 0 if group & req else req, size)[0]
                if rest[0] < 0:
                    continue
                here = self._group_key(group)
                total = (here[0] + rest[0], here[1] + rest[1])          # score, sets in one NUMA node
                if best is None or total > best[0]:
                    best = (total, group)
            best = best or ((-1, 0), mask)
        if len(self._memo) > _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = best
        return best

    def _group_key(self, group: int) -> tuple[int, int, int]:
        """(score, inside one NUMA node, minus the NUMA nodes spanned) of a set, as a mask."""
        hit = self._sets.get(group)
        if hit is None:
            members = _members(group)
            nodes = self.numa_nodes(members)
            hit = self._sets[group] = (self.set_score(members), int(nodes == 1), -nodes)
        return hit

    def _greedy(self, available, required, size: int, rank) -> tuple[int, ...]:
        chosen = list(required)
        if not chosen:
            pair = max(itertools.combinations(available, 2),
                       key=lambda p: (self.score(*p), -self.numa_nodes(p), _neg(rank(p))))
            chosen = list(pair)
        while len(chosen) < size:
            nxt = max((i for i in available if i not in chosen),
                      key=lambda i: (sum(self.score(i, c) for c in chosen), -self.numa_nodes([*chosen, i]),
                                     _neg(rank((*chosen, i)))))
            chosen.append(nxt)
        return tuple(sorted(chosen))


def _mask(indices) -> int:
    out = 0
    for i in indices:
        out |= 1 << i
    return out


def _members(mask: int) -> tuple[int, ...]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


class _neg:
    """Reverses a comparable so that ``max`` prefers the lower."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __lt__(self, other):
        return self.value > other.value

    def __gt__(self, other):
        return self.value < other.value

    def __eq__(self, other):
        return self.value == other.value
