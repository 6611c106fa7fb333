"""Preferred allocations, pure: which of the devices a kubelet offers a container it should get.

Before it allocates, the kubelet's device manager asks a device plugin which ``size`` of the
``available`` devices (``must_include`` among them) it would rather hand out. The answer here:

- **Whole GPUs: the best-connected set** (``topology.ranking``): NVIDIA go-gpuallocator's
  best-effort policy over NVLinks and PCIe levels (the device plugin's own choice for whole
  GPUs), then the fewest NUMA nodes, then the tie-breaks below.
- **MIG devices: one parent GPU** where one holds them all (the one with the fewest offered
  that does, so whole GPUs stay free for whole-GPU work); else the parents with the most
  offered first, each next one the best connected to those taken.
- **NUMA first** where the topology is unknown (a GPU NVML cannot place; the caller logs
  why), and as the tie-break above: as few NUMA nodes as possible, the ones of
  ``must_include`` first; among the NUMA nodes that hold the request alone, the one with the
  fewest offered devices (tightest fit, so large free groups stay whole for large requests);
  inside it MIG devices from the GPU with the fewest offered devices first, then index order.
- **Replicas** (``<uuid>::<n>`` ids of shared devices) spread across devices, the least used
  first (``distributed``, as the NVIDIA device plugin does by default), or fill the most used
  device first (``packed``). "Used" counts the agent's allocations on the device plus the
  replicas this answer already took from it; ``distributed`` also takes the NUMA node with
  the most replicas free.

Ids are answered as the caller spelled them (the kubelet compares strings).
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import UsageError
from ..topology.ranking import Links
from .allocations import InsufficientDevices, UnknownDevice

__all__ = ["prefer", "POLICIES", "REPLICA_SEPARATOR", "split_replica"]

POLICIES = ("distributed", "packed")
REPLICA_SEPARATOR = "::"


def split_replica(ident: str) -> tuple[str, str | None]:
    """``GPU-x::3`` -> (``GPU-x``, ``3``); a plain id -> (id, None)."""
    base, sep, replica = ident.partition(REPLICA_SEPARATOR)
    return base, (replica if sep else None)


class _Unit(NamedTuple):
    ident: str            # as the caller spelled it
    uuid: str             # the physical device (GPU or MIG device)
    parent: str           # the GPU it is on (itself for a GPU)
    gpu: int              # that GPU's index
    whole: bool           # a whole GPU (not a MIG device)
    numa: int | None
    replica: str | None
    order: tuple


def _unit(ident: str, devices: dict[str, dict], lookup: dict[str, str]) -> _Unit:
    base, replica = split_replica(ident)
    uuid = lookup.get(base.strip())
    view = devices.get(uuid) if uuid else None
    if view is None:
        raise UnknownDevice(f"no device {ident!r} on this node", device=ident,
                            hint="offer devices by the ids GET /v1/devices lists (UUIDs, "
                                 "with ::<n> for replicas)")
    parent = devices.get(view.get("parent_uuid") or "", view)
    index = view["index"] if view["kind"] == "gpu" else view["parent_index"]
    order = (index, -1 if view["kind"] == "gpu" else view["index"], int(replica) if (replica or "").isascii() and (replica or "").isdigit() else 0)
    return _Unit(ident, uuid, parent["uuid"], index, view["kind"] == "gpu", parent.get("numa_node"), replica, order)


def prefer(available: list[str], must_include: list[str], size: int, devices: dict[str, dict],
           lookup: dict[str, str], in_use: dict[str, int], policy: str = "distributed",
           links: Links | None = None) -> list[str]:
    """``size`` ids: ``must_include`` first, then the preferred ones of ``available``.

    ``devices``: uuid -> device view (``GET /v1/devices``); ``lookup``: any device name ->
    uuid; ``in_use``: uuid -> allocations using it; ``links``: how the GPUs are connected
    (None, or unknown for a GPU offered: NUMA first)."""
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}", hint=f"use one of {', '.join(POLICIES)}")
    units = {i: _unit(i, devices, lookup) for i in dict.fromkeys([*available, *must_include])}
    offered_units = {(units[i].uuid, units[i].replica) for i in available}
    outside = [i for i in dict.fromkeys(must_include) if (units[i].uuid, units[i].replica) not in offered_units]
    if outside:
        # The kubelet's must_include is a part of what it offers: a device it does not offer
        # is no answer to give (go-gpuallocator answers no set either).
        raise UsageError(f"must_include names device(s) not among the available ones: {', '.join(outside[:5])}"
                         + (" ..." if len(outside) > 5 else ""), devices=outside,
                         hint="must_include is part of available: offer those devices, or leave them out")
    must = list(dict.fromkeys(must_include))
    musts = {(units[i].uuid, units[i].replica) for i in must}
    offered = must + [i for i in dict.fromkeys(available) if (units[i].uuid, units[i].replica) not in musts]
    units = {i: units[i] for i in offered}
    if size < len(must):
        raise UsageError(f"size {size} is smaller than the {len(must)} device(s) that must be included")
    if size > len(units):
        raise InsufficientDevices(f"{size} device(s) wanted, {len(units)} offered",
                                  wanted=size, available=len(units))
    needed = size - len(must)
    if needed == 0:
        return must
    taken = set(must)
    candidates = [units[i] for i in offered if i not in taken]
    replicas = any(u.replica is not None for u in candidates)
    spread = replicas and policy == "distributed"

    groups: dict[int | None, list[_Unit]] = {}
    for u in candidates:
        groups.setdefault(u.numa, []).append(u)
    must_numas = {units[i].numa for i in must}

    def group_key(numa):
        size_here = len(groups[numa])
        fits = size_here >= needed
        # Fitting alone: the tightest (or, spreading replicas, the loosest); none fits: the
        # largest first, to span the fewest NUMA nodes.
        tightness = -size_here if (spread or not fits) else size_here
        return (numa not in must_numas, not fits, tightness, numa is None, numa or 0)
    rank = {numa: r for r, numa in enumerate(sorted(groups, key=group_key))}

    per_parent: dict[str, int] = {}
    for u in candidates:
        per_parent[u.parent] = per_parent.get(u.parent, 0) + 1
    picked: dict[str, int] = {}

    def key(u: _Unit):
        if replicas:
            used = in_use.get(u.uuid, 0) + picked.get(u.uuid, 0)
            inner = (used if policy == "distributed" else -used,)
        else:
            inner = (per_parent[u.parent],)
        return (rank[u.numa], *inner, u.order, u.ident)

    gpus = {u.gpu for u in units.values()}
    whole = all(u.whole for u in units.values())
    if (links is not None and not replicas and (must or needed > 1) and not links.why_unknown(gpus)
            and not (whole and len(gpus) < len(units))):      # a GPU offered twice, spelt two ways
        if whole:
            return must + _best_gpus(links, [units[i] for i in must], candidates, size, key)
        return must + _one_parent(links, [units[i] for i in must], candidates, needed, key)
    chosen = []
    pool = list(candidates)
    for _ in range(needed):
        best = min(pool, key=key)
        pool.remove(best)
        picked[best.uuid] = picked.get(best.uuid, 0) + 1
        chosen.append(best.ident)
    return must + chosen


def _best_gpus(links: Links, must: list[_Unit], candidates: list[_Unit], size: int, key) -> list[str]:
    """The best-connected set of whole GPUs holding ``must`` (``key``: the tie-break after NUMA)."""
    by_gpu = {u.gpu: u for u in [*must, *candidates]}
    taken = {u.gpu for u in must}
    best = links.best(list(by_gpu), list(taken), size,
                      rank=lambda members: sorted(key(by_gpu[i]) for i in members if i not in taken))
    return [u.ident for u in sorted((by_gpu[i] for i in best if i not in taken), key=key)]


def _one_parent(links: Links, must: list[_Unit], candidates: list[_Unit], needed: int, key) -> list[str]:
    """MIG devices (or a mix): from the GPUs ``must`` is on first, then one GPU, else the
    best-connected GPUs (``Links.spread``); inside a GPU in ``key`` order."""
    pools: dict[int, list[_Unit]] = {}
    for u in sorted(candidates, key=key):
        pools.setdefault(u.gpu, []).append(u)
    picked = links.spread(pools, needed, {u.gpu for u in must}, tiebreak=lambda gpu: key(pools[gpu][0]))
    return [u.ident for u in picked]
