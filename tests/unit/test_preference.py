"""Preferred allocations: NUMA first, the tightest fit, replicas distributed or packed."""

import pytest

from hostagent.daemon.allocations import InsufficientDevices, UnknownDevice
from hostagent.daemon.preference import prefer
from hostagent.errors import UsageError


def views(numas=(0, 0, 0, 0, 1, 1, 1, 1), migs=()):
    out = {}
    for i, numa in enumerate(numas):
        out[f"GPU-{i}"] = {"kind": "gpu", "uuid": f"GPU-{i}", "index": i, "numa_node": numa, "name": str(i)}
    for parent, j in migs:
        out[f"MIG-{parent}-{j}"] = {"kind": "mig", "uuid": f"MIG-{parent}-{j}", "index": j, "parent_index": parent,
                                   "parent_uuid": f"GPU-{parent}", "name": f"{parent}:{j}"}
    return out


def run(available, size, must=(), v=None, in_use=None, policy="distributed"):
    v = v or views()
    lookup = {**{k: k for k in v}, **{d["name"]: k for k, d in v.items()}}
    return prefer(list(available), list(must), size, v, lookup, in_use or {}, policy)


def gpus(*i):
    return [f"GPU-{n}" for n in i]


def test_numa_first_tightest_node_that_fits():
    assert run(gpus(6, 0, 4, 1, 5), 2) == gpus(0, 1)            # NUMA 0 offers 2: tightest
    assert run(gpus(0, 1, 4, 5, 6), 3) == gpus(4, 5, 6)         # only NUMA 1 holds 3
    assert run(gpus(0, 4, 5), 3) == gpus(4, 5, 0)               # none holds 3: the fullest first
    assert run(gpus(0, 1, 4, 5, 6), 2, must=gpus(5)) == gpus(5, 4)   # must_include pulls to its node
    assert run(gpus(0, 1), 2, must=gpus(0, 1)) == gpus(0, 1)


def test_mig_devices_pack_onto_the_fullest_gpu():
    v = views(migs=[(0, 0), (0, 1), (0, 2), (1, 0)])
    assert run(["MIG-0-0", "MIG-0-1", "MIG-0-2", "MIG-1-0"], 1, v=v) == ["MIG-1-0"]
    assert run(["MIG-0-0", "MIG-0-1", "MIG-0-2", "MIG-1-0"], 2, v=v) == ["MIG-1-0", "MIG-0-0"]


def test_replicas_distributed_or_packed():
    offered = [f"GPU-{g}::{r}" for g in (0, 1) for r in range(3)]
    assert run(offered, 2) == ["GPU-0::0", "GPU-1::0"]                       # spread
    assert run(offered, 2, in_use={"GPU-0": 2}) == ["GPU-1::0", "GPU-1::1"]  # the least used
    assert run(offered, 2, in_use={"GPU-1": 1}, policy="packed") == ["GPU-1::0", "GPU-1::1"]
    assert run(offered, 4, policy="packed") == ["GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-1::0"]


def test_ids_keep_the_callers_spelling_and_bad_requests_fail():
    assert run(["0", "1"], 1) == ["0"]
    with pytest.raises(UnknownDevice):
        run(["GPU-9"], 1)
    with pytest.raises(InsufficientDevices):
        run(gpus(0, 1), 3)
    with pytest.raises(UsageError):
        run(gpus(0, 1), 1, must=gpus(0, 1))
    with pytest.raises(UsageError):
        run(gpus(0), 1, policy="random")
