"""The simulator's node profiles as loaded from its data files."""

import dataclasses

from hostagent.sim import catalog


def test_gpus_split_over_numa_nodes_in_order_and_none_gives_minus_one():
    profile = catalog.load_profile("dgx-a100")
    assert [profile.numa_node(i) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    no_numa = dataclasses.replace(profile, numa_nodes=0)   # sysfs: no NUMA information
    assert [no_numa.numa_node(i) for i in range(8)] == [-1] * 8
