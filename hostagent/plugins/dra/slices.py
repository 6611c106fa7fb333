"""The pool's ResourceSlices, pure: a ``Pool`` in, the slices' specs out, within the API
server's limits for its version.

- Devices that consume no counters: slices of at most 128 (64 from 1.35 once one of them
  has taints).
- Partitions (which consume their GPU's counters) are grouped by GPU, in slices of at most
  64 (the limit of slices whose devices consume counters, from 1.35).
- Counter sets: on a 1.34 API server in the slice of their GPU's partitions (a device
  draws on a set of its own slice there); from 1.35 a slice holds either devices or counter
  sets, so the sets come in slices of their own, first, at most 8 a slice.

Every slice of the pool names the node, the driver and the pool; ``publisher`` adds the
generation and the slice count, which must be the same in all of them.
"""

from __future__ import annotations

from .devices import Pool

__all__ = ["layout", "MAX_DEVICES", "MAX_DEVICES_WITH_COUNTERS", "MAX_COUNTER_SETS", "split_counter_sets"]

MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS = 64     # from 1.35, also a slice with a device that has taints
MAX_COUNTER_SETS = 8                # a slice's counter sets, from 1.35
MAX_COUNTERS_134 = 32               # a 1.34 slice's counters, all sets together


def split_counter_sets(version: tuple[int, int]) -> bool:
    """Whether counter sets go in slices of their own (from Kubernetes 1.35)."""
    return version >= (1, 35)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def layout(pool: Pool, driver: str, pool_name: str, node: str, version: tuple[int, int]) -> list[dict]:
    """The specs of the pool's slices, in the order they are named (first fit follows it):
    counter sets (1.35+), then devices that consume nothing, then each GPU's partitions.
    Always at least one slice: an empty one says the driver is there with no devices."""
    plain = [d.resource() for d in pool.devices if not d.counter_sets]
    # Devices that draw on counters, by the first set they draw on (a GPU's whole-GPU set,
    # else its MIG set); the sets each group draws on.
    by_set: dict[str, list[dict]] = {}
    drawn: dict[str, list[str]] = {}
    for d in pool.devices:
        if d.counter_sets:
            by_set.setdefault(d.counter_sets[0], []).append(d.resource())
            names = drawn.setdefault(d.counter_sets[0], [])
            names += [n for n in d.counter_sets if n not in names]
    sets = {s.name: s.resource() for s in pool.counter_sets}
    base = {"driver": driver, "pool": {"name": pool_name}, "nodeName": node}
    specs: list[dict] = []
    if split_counter_sets(version):
        plain_max = MAX_DEVICES_WITH_COUNTERS if any(d.get("taints") for d in plain) else MAX_DEVICES
        specs += [{**base, "sharedCounters": chunk} for chunk in _chunks(list(sets.values()), MAX_COUNTER_SETS)]
        specs += [{**base, "devices": chunk} for chunk in _chunks(plain, plain_max)]
        for name, devices in by_set.items():
            specs += [{**base, "devices": chunk} for chunk in _chunks(devices, MAX_DEVICES_WITH_COUNTERS)]
    else:
        specs += [{**base, "devices": chunk} for chunk in _chunks(plain, MAX_DEVICES)]
        for name, devices in by_set.items():
            # One slice for the set and all that draw on it (1.34 resolves a set in its slice).
            specs.append({**base, "sharedCounters": [sets[n] for n in drawn[name] if n in sets],
                          "devices": devices[:MAX_DEVICES]})
    return specs or [{**base, "devices": []}]
