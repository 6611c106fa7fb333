"""Preferred allocations: NUMA first, the tightest fit, replicas distributed or packed."""

import pytest

from hostagent.daemon.allocations import InsufficientDevices, UnknownDevice
from hostagent.daemon.preference import prefer
from hostagent.errors import UsageError
from hostagent.topology.ranking import Links

from .gpu_nodes import DGX1_VOLTA, node


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


def test_mig_devices_pack_onto_the_fullest_gpu_without_topology():
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


# ---- with the GPUs' topology (the DGX-1 of go-gpuallocator's tests) -------------------

def with_links(available, size, must=(), v=None, links=None, in_use=None):
    v = v or views()
    lookup = {**{k: k for k in v}, **{d["name"]: k for k, d in v.items()}}
    return prefer(list(available), list(must), size, v, lookup, in_use or {}, links=links or DGX1_VOLTA)


def test_whole_gpus_take_the_best_connected_set_before_numa():
    # Dual NVLink across the sockets beats a single one within a socket (go-gpuallocator's
    # "Prefer dual NVLINK cross socket"); by NUMA alone the pair would be 0 and 1.
    assert run(gpus(0, 1, 4), 2) == gpus(0, 1)
    assert sorted(with_links(gpus(0, 1, 4), 2)) == gpus(0, 4)
    # The best division of what is offered: a pair that leaves a good pair behind.
    assert with_links(gpus(0, 2, 4, 5), 2) == gpus(4, 5)
    assert with_links(gpus(*range(8)), 4, must=gpus(4)) == gpus(4, 5, 6, 7)
    assert with_links(gpus(*range(8)), 2, must=gpus(4)) == gpus(4, 7)


def test_among_equally_connected_sets_numa_then_the_tightest_fit():
    flat = node({}, {(a, b): "NODE" for a in range(8) for b in range(a + 1, 8)}, [0] * 8)
    flat.numa.update({4: 1, 5: 1, 6: 1, 7: 1})
    # Every pair scores the same: the tightest NUMA node that holds the request wins.
    assert with_links(gpus(6, 0, 4, 1, 5), 2, links=flat) == gpus(0, 1)


def test_a_gpu_of_unknown_topology_falls_back_to_numa():
    unknown = Links(DGX1_VOLTA.scores, DGX1_VOLTA.numa, DGX1_VOLTA.nvlinks, DGX1_VOLTA.codes,
                    unknown={4: "nvmlDeviceGetTopologyCommonAncestor: Not Supported"})
    assert unknown.why_unknown([0, 1, 4]) == "GPU 4: nvmlDeviceGetTopologyCommonAncestor: Not Supported"
    assert with_links(gpus(0, 1, 4), 2, links=unknown) == gpus(0, 1)
    assert sorted(with_links(gpus(0, 1, 3), 2, links=unknown)) == gpus(0, 3)    # GPU 4 not offered


def test_mig_devices_prefer_one_parent_then_the_best_connected_parents():
    v = views(migs=[(0, 0), (0, 1), (0, 2), (1, 0)])
    offered = ["MIG-0-0", "MIG-0-1", "MIG-0-2", "MIG-1-0"]
    assert with_links(offered, 1, v=v) == ["MIG-1-0"]                         # the tightest that fits
    assert with_links(offered, 2, v=v) == ["MIG-0-0", "MIG-0-1"]              # one parent
    assert with_links(offered, 4, v=v) == ["MIG-0-0", "MIG-0-1", "MIG-0-2", "MIG-1-0"]
    assert with_links(offered, 2, must=["MIG-1-0"], v=v) == ["MIG-1-0", "MIG-0-0"]
    # No parent holds three: two from the first, then the parent best connected to it
    # (GPU 3: NV2 and the same host bridge; GPU 4: NV2 across the sockets).
    v = views(migs=[(g, j) for g in (0, 3, 4) for j in (0, 1)])
    offered = [f"MIG-{g}-{j}" for g in (4, 3, 0) for j in (0, 1)]
    assert with_links(offered, 3, v=v) == ["MIG-0-0", "MIG-0-1", "MIG-3-0"]


def test_replicas_are_spread_as_before_whatever_the_links():
    offered = [f"GPU-{g}::{r}" for g in (0, 1) for r in range(3)]
    assert with_links(offered, 2) == ["GPU-0::0", "GPU-1::0"]


def test_must_include_is_part_of_what_is_offered():
    """go-gpuallocator's "Must include with unavailable device": no set. A device that must be
    included but is not offered is a bad request, however it is spelled."""
    with pytest.raises(UsageError) as e:
        run(gpus(0, 1, 2), 2, must=gpus(5))
    assert "must_include names device(s) not among the available ones: GPU-5" in e.value.message
    with pytest.raises(UsageError):
        run(["GPU-0::0", "GPU-0::1"], 1, must=["GPU-0::2"])               # another replica of the device
    assert run(gpus(0, 1, 4), 2, must=["1"]) == ["1", "GPU-0"]            # offered, spelt another way
