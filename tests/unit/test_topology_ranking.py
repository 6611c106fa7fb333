"""The best-connected set: go-gpuallocator's own test cases, as tables.

Data (not code) from NVIDIA/go-gpuallocator at 876e7b7609bb: the nodes of
``gpuallocator/common_test.go`` (New4xRTX8000Node, NewDGX1PascalNode, NewDGX1VoltaNode: each
pair's PCIe link and NVLink count) and the expected results of
``gpuallocator/besteffort_test.go`` (TestBestEffortAllocate and the sequential
TestBestEffort*Alloc* tests). A node's NUMA nodes are its two CPU sockets (the fixtures'
CrossCPU pairs).
"""

import pytest

from hostagent.topology.ranking import Links

from .gpu_nodes import ALL, DGX1_PASCAL, DGX1_VOLTA, RTX8000, node


# TestBestEffortAllocate: (description, available, required, size, expected; () = none).
ALLOCATE = [
    ("Single NVLINK, prefer same switch", [0, 2, 4, 5], [], 2, (4, 5)),
    ("Single NVLINK, prefer same socket", [0, 4, 5, 6], [], 2, (5, 6)),
    ("Prefer dual NVLINK same socket", [0, 3, 1], [], 2, (0, 3)),
    ("Prefer dual NVLINK cross socket", [0, 1, 4], [], 2, (0, 4)),
    ("Must include with allocation size 1", ALL, [4], 1, (4,)),
    ("Must include with allocation size 2", ALL, [4], 2, (4, 7)),
    ("Must include with allocation size 4", ALL, [4], 4, (4, 5, 6, 7)),
    ("Must include with unavailable device", [1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3], 4, ()),
    ("Must include with full set specified", ALL, [0, 2, 4, 6], 4, (0, 2, 4, 6)),
    ("Must include with too many devices specified", ALL, [1, 2, 3, 4, 5, 6], 4, ()),
    ("Required too many devices than available", [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], 1, ()),
]

# The sequential tests: each call takes from what the earlier ones left.
SEQUENCES = {
    "4xRTX8000 AllocOne": (RTX8000, 4, [(1, (0,)), (1, (1,)), (1, (2,)), (1, (3,)), (1, ())]),
    "4xRTX8000 AllocTwo": (RTX8000, 4, [(2, (0, 3)), (2, (1, 2)), (1, ())]),
    "4xRTX8000 AllocFour": (RTX8000, 4, [(4, (0, 1, 2, 3)), (1, ())]),
    "DGX1Pascal AllocOne": (DGX1_PASCAL, 8, [(1, (i,)) for i in range(8)] + [(1, ())]),
    "DGX1Pascal AllocTwo": (DGX1_PASCAL, 8, [(2, (0, 2)), (2, (1, 3)), (2, (4, 6)), (2, (5, 7)), (1, ())]),
    "DGX1Pascal AllocFour": (DGX1_PASCAL, 8, [(4, (0, 1, 2, 3)), (4, (4, 5, 6, 7)), (1, ())]),
    "DGX1Pascal AllocEight": (DGX1_PASCAL, 8, [(8, tuple(ALL)), (1, ())]),
    "DGX1Volta AllocOne": (DGX1_VOLTA, 8, [(1, (i,)) for i in range(8)] + [(1, ())]),
    "DGX1Volta AllocTwo": (DGX1_VOLTA, 8, [(2, (0, 3)), (2, (1, 2)), (2, (4, 7)), (2, (5, 6)), (1, ())]),
    "DGX1Volta AllocFour": (DGX1_VOLTA, 8, [(4, (0, 1, 2, 3)), (4, (4, 5, 6, 7)), (1, ())]),
    "DGX1Volta AllocEight": (DGX1_VOLTA, 8, [(8, tuple(ALL)), (1, ())]),
}


def tightest_numa(links: Links, available):
    """The tie-break hostagent adds after NUMA: the NUMA node with the fewest offered GPUs
    first, then index order."""
    per_node = {}
    for i in available:
        per_node[links.numa[i]] = per_node.get(links.numa[i], 0) + 1
    return lambda members: sorted((per_node[links.numa[i]], i) for i in members)


@pytest.mark.parametrize("description,available,required,size,expected", ALLOCATE, ids=[c[0] for c in ALLOCATE])
def test_best_effort_allocate(description, available, required, size, expected):
    got = DGX1_VOLTA.best(available, required, size, tightest_numa(DGX1_VOLTA, available))
    assert (got or ()) == expected


@pytest.mark.parametrize("name", SEQUENCES)
def test_best_effort_sequences(name):
    links, count, calls = SEQUENCES[name]
    remaining = list(range(count))
    for size, expected in calls:
        got = links.best(remaining, [], size, tightest_numa(links, remaining)) or ()
        assert got == expected, (remaining, size)
        remaining = [i for i in remaining if i not in got]


def test_the_division_is_remembered_across_calls_and_gives_the_same_answers():
    links = node(DGX1_VOLTA.nvlinks, {}, [0] * 8)
    first = [links.best(ALL[:n], [], 2) for n in range(2, 9)]
    assert links._memo
    assert [links.best(ALL[:n], [], 2) for n in range(2, 9)] == first
