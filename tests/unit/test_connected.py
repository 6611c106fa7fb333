"""What a constraint group takes: the best-connected set, ``links: nvlink``, ``pcie_root: same``."""

import pytest

from hostagent.daemon.allocations import Candidate
from hostagent.daemon.connected import Unconnected, take
from hostagent.topology.ranking import Links

from .gpu_nodes import DGX1_VOLTA, node


def gpu(i: int) -> Candidate:
    return Candidate(f"GPU-{i}", str(i), "gpu", "GPU", 32768, "7.0", None, (i, -1))


def mig(parent: int, j: int) -> Candidate:
    return Candidate(f"MIG-{parent}-{j}", f"{parent}:{j}", "mig", "GPU", 4864, "8.0", "1g.5gb", (parent, j))


def names(devices) -> list[str]:
    return [d.name for d in devices]


# The l40s-pcie profile's PCIe tree: pairs on a switch (PIX), socket 0's switches cascaded
# under one root (PXB), socket 1's on two roots (NODE).
L40S = node({}, {**{(a, b): "SYS" for a in range(4) for b in range(4, 8)},
                 **{(0, 1): "PIX", (2, 3): "PIX", (4, 5): "PIX", (6, 7): "PIX"},
                 **{(a, b): "PXB" for a in (0, 1) for b in (2, 3)}, **{(a, b): "NODE" for a in (4, 5) for b in (6, 7)}},
            [0, 0, 0, 0, 1, 1, 1, 1])
L40S.roots.update({0: "pci0000:16", 1: "pci0000:16", 2: "pci0000:16", 3: "pci0000:16",
                   4: "pci0000:97", 5: "pci0000:97", 6: "pci0000:b7", 7: "pci0000:b7"})


def test_whole_gpus_take_the_best_connected_set_and_one_device_the_first():
    assert names(take([gpu(0), gpu(1), gpu(4)], 2, {}, DGX1_VOLTA)) == ["0", "4"]     # NV2 over NV1
    assert names(take([gpu(1), gpu(0)], 1, {"links": "nvlink"}, DGX1_VOLTA)) == ["1"]
    assert names(take([gpu(i) for i in range(8)], 4, {}, L40S)) == ["0", "1", "2", "3"]   # PXB over NODE


def test_nvlink_takes_only_sets_joined_pairwise_and_names_the_best_there_was():
    every = [gpu(i) for i in range(8)]
    assert names(take(every, 4, {"links": "nvlink"}, DGX1_VOLTA)) == ["0", "1", "2", "3"]
    assert names(take([gpu(0), gpu(5), gpu(6), gpu(4)], 2, {"links": "nvlink"}, DGX1_VOLTA)) == ["5", "6"]
    with pytest.raises(Unconnected) as e:
        take(every, 5, {"links": "nvlink"}, DGX1_VOLTA)       # the cube-mesh's cliques are of four
    assert "the best connected were GPUs 0, 1, 2, 3, 4 (0-1 NV1" in e.value.why
    assert "0-4 NV2" in e.value.why and "1-4 SYS" in e.value.why      # the pair NVLink does not join
    assert e.value.best == ["0", "1", "2", "3", "4"] and e.value.asked == "links: nvlink"
    with pytest.raises(Unconnected) as e:
        take([gpu(i) for i in range(4)], 2, {"links": "nvlink"}, L40S)     # PCIe only
    assert "(0-1 PIX)" in e.value.why and e.value.best == ["0", "1"]
    with pytest.raises(Unconnected) as e:
        take([mig(0, 0), mig(0, 1)], 2, {"links": "nvlink"}, DGX1_VOLTA)
    assert "no peer-to-peer" in e.value.why


def test_pcie_root_same_keeps_to_one_root():
    every = [gpu(i) for i in range(8)]
    assert names(take(every, 4, {"pcie_root": "same"}, L40S)) == ["0", "1", "2", "3"]
    assert names(take(every[4:], 2, {"pcie_root": "same"}, L40S)) == ["4", "5"]
    with pytest.raises(Unconnected) as e:
        take(every[4:], 3, {"pcie_root": "same"}, L40S)
    assert str(e.value).startswith("pcie_root: same: the best connected were GPUs 4, 5, 6")


def test_mig_devices_take_one_parent_where_one_holds_them():
    room = [mig(0, 0), mig(4, 0), mig(4, 1), mig(3, 0)]
    assert names(take(room, 2, {}, DGX1_VOLTA)) == ["4:0", "4:1"]
    # Spread: the first parent, then the one best connected to it (3: NV2 on its host bridge).
    assert names(take([mig(0, 0), mig(4, 0), mig(3, 0)], 2, {}, DGX1_VOLTA)) == ["0:0", "3:0"]


def test_unknown_topology_is_never_guessed():
    unknown = Links(DGX1_VOLTA.scores, DGX1_VOLTA.numa, DGX1_VOLTA.nvlinks, DGX1_VOLTA.codes,
                    unknown={4: "Not Supported"})
    with pytest.raises(Unconnected):
        take([gpu(0), gpu(4)], 2, {"links": "nvlink"}, unknown)
    assert names(take([gpu(0), gpu(4), gpu(1)], 2, {"links": "nvlink"}, unknown)) == ["0", "1"]
    # Without a topology constraint: the NUMA node that holds the group, the tightest.
    assert names(take([gpu(0), gpu(4), gpu(5), gpu(1), gpu(2)], 2, {}, unknown)) == ["4", "5"]
    with pytest.raises(Unconnected):
        take([gpu(0), gpu(1)], 2, {"pcie_root": "same"}, None)
    assert names(take([gpu(0), gpu(4)], 2, {}, None)) == ["0", "4"]
