"""Which of the free devices matching a constraint group the group takes, pure.

``room`` comes ordered by the allocation's own tie-breaks (least shared, smallest, first).
Of it a group of ``count`` takes:

- whole GPUs: the best-connected set (``topology.ranking``: NVLinks and PCIe levels, then
  the fewest NUMA nodes, then ``room``'s order);
- MIG devices: from one parent GPU where one holds them all, else from the best-connected
  parents (``Links.spread``);
- ``"links": "nvlink"``: only a set whose every pair is joined by NVLink (MIG devices never
  are: a MIG-enabled GPU has no peer-to-peer access, over NVLink or PCIe, in NVIDIA's MIG user
  guide); ``"pcie_root": "same"``: only devices under one PCIe root. A GPU whose topology NVML
  would not tell satisfies neither. With no such set free ``Unconnected`` says why, naming
  the best-connected set there was (the allocation refuses the group with it:
  ``insufficient_devices``);
- where the topology of a device in ``room`` is unknown (and no topology constraint is
  asked): the NUMA node that holds the group alone, the tightest, else ``room``'s order.

Devices are ``allocations.Candidate`` records (their ``order`` begins with the GPU's index).
"""

from __future__ import annotations

from ..topology.ranking import Links

__all__ = ["take", "Unconnected", "TOPOLOGY_KEYS"]

TOPOLOGY_KEYS = ("links", "pcie_root")


class Unconnected(Exception):
    """No set of the devices free is connected as the constraints ask: ``why``, and ``best``,
    the names of the best-connected set there was."""

    def __init__(self, asked: str, why: str, best: list[str]):
        super().__init__(f"{asked}: {why}")
        self.asked, self.why, self.best = asked, why, best


def _gpu(c) -> int:
    return c.order[0]


def take(room: list, count: int, constraints: dict, links: Links | None) -> list:
    """``count`` devices of ``room`` (there are at least that many)."""
    if count == 1:          # no pair to connect: the allocation's own order alone
        return room[:1]
    nvlink = constraints.get("links") == "nvlink"
    same_root = constraints.get("pcie_root") == "same"
    if links is None:
        if nvlink or same_root:
            _refuse(constraints, "the GPUs' topology is not known", [])
        return room[:count]
    if nvlink or same_root:
        known = [c for c in room if _gpu(c) not in links.unknown]
        chosen = _constrained(known, count, nvlink, same_root, links)
        if chosen is None:
            _refuse(constraints, *_best_there_was(known, count, links))
        return chosen
    if links.why_unknown({_gpu(c) for c in room}):
        return _numa_first(room, count, links)
    if all(c.kind == "gpu" for c in room):
        position = {_gpu(c): i for i, c in enumerate(room)}
        best = links.best(list(position), [], count, rank=lambda s: sorted(position[g] for g in s))
        return [c for c in room if _gpu(c) in best]
    return _by_parent(room, count, links)


def _by_parent(room: list, count: int, links: Links) -> list:
    pools: dict[int, list] = {}
    for c in room:
        pools.setdefault(_gpu(c), []).append(c)
    first = {g: room.index(items[0]) for g, items in pools.items()}
    return links.spread(pools, count, tiebreak=first.__getitem__)


def _constrained(room, count, nvlink: bool, same_root: bool, links: Links) -> list | None:
    if nvlink and any(c.kind != "gpu" for c in room):
        room = [c for c in room if c.kind == "gpu"]       # MIG devices: no peer-to-peer at all
    groups: dict[object, list] = {}
    for c in room:
        groups.setdefault(links.roots.get(_gpu(c)) if same_root else None, []).append(c)
    best, best_key = None, None
    for root, members in groups.items():
        if root is None and same_root:
            continue                                      # no root known: never guessed
        picked = _in_group(members, count, nvlink, links)
        if picked is None:
            continue
        gpus = sorted({_gpu(c) for c in picked})
        key = (-len(gpus), links.set_score(gpus), -links.numa_nodes(gpus), -min(room.index(c) for c in picked))
        if best_key is None or key > best_key:
            best, best_key = picked, key
    return best


def _in_group(members, count: int, nvlink: bool, links: Links) -> list | None:
    if len(members) < count:
        return None
    if all(c.kind == "gpu" for c in members):
        position = {_gpu(c): i for i, c in enumerate(members)}
        valid = (lambda s: all(links.nvlinked(a, b) for i, a in enumerate(s) for b in s[i + 1:])) if nvlink \
            else (lambda s: True)
        best = links.best_valid(list(position), count, valid, rank=lambda s: sorted(position[g] for g in s))
        return None if best is None else [c for c in members if _gpu(c) in best]
    return _by_parent(members, count, links)


def _numa_first(room: list, count: int, links: Links) -> list:
    nodes: dict[object, list] = {}
    for c in room:
        nodes.setdefault(links.numa.get(_gpu(c)), []).append(c)
    fitting = [members for members in nodes.values() if len(members) >= count]
    if not fitting:
        return room[:count]
    return min(fitting, key=lambda members: (len(members), room.index(members[0])))[:count]


def _best_there_was(room, count: int, links: Links) -> tuple[str, list[str]]:
    """Why, naming the best-connected set of the room's GPUs, and that set's device names."""
    gpus = sorted({_gpu(c) for c in room if c.kind == "gpu"})
    if len(gpus) < min(count, 2):
        return "MIG devices have no peer-to-peer access (NVLink or PCIe)" if room else "none is free", []
    best = links.best(gpus, [], min(count, len(gpus))) or tuple(gpus[:count])
    names = [c.name for c in room if c.kind == "gpu" and _gpu(c) in best]
    return f"the best connected were GPUs {', '.join(map(str, best))} ({links.describe(best)})", names


def _refuse(constraints: dict, why: str, best: list[str]):
    asked = " and ".join(f"{k}: {constraints[k]}" for k in TOPOLOGY_KEYS if k in constraints)
    raise Unconnected(asked, why, best)
