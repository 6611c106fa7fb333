"""The simulator's node profiles as loaded from its data files."""

import dataclasses

from hostagent.sim import catalog


def test_gpus_numa_nodes_from_the_topology_or_in_order_and_none_gives_minus_one():
    profile = catalog.load_profile("dgx-a100")
    assert [profile.numa_node(i) for i in range(8)] == [3, 3, 1, 1, 7, 7, 5, 5]     # NPS4, as published
    in_order = dataclasses.replace(catalog.load_profile("t4x2"), topology=None)
    assert [in_order.numa_node(i) for i in range(2)] == [0, 1]
    no_numa = dataclasses.replace(profile, numa_nodes=0)   # sysfs: no NUMA information
    assert [no_numa.numa_node(i) for i in range(8)] == [-1] * 8
