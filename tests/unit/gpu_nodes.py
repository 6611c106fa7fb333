"""GPU nodes of NVIDIA/go-gpuallocator's tests, as data.

From ``gpuallocator/common_test.go`` at 876e7b7609bb: New4xRTX8000Node, NewDGX1PascalNode and
NewDGX1VoltaNode, each pair's PCIe link and NVLink count (the data, not the code). A node's
NUMA nodes are its two CPU sockets (the fixtures' CrossCPU pairs).
"""

from hostagent.topology.ranking import NVLINK_POINTS, PCIE_POINTS, Links

# go-gpuallocator's P2PLink types -> nvidia-smi's codes.
CROSS, SAME, BRIDGE, SWITCH = "SYS", "NODE", "PHB", "PIX"


def node(nvlinks: dict, pcie: dict, numa: list) -> Links:
    scores, counts, codes = {}, {}, {}
    for pair in {*nvlinks, *pcie}:
        a, b = sorted(pair)
        scores[a, b] = PCIE_POINTS.get(pcie.get(pair), 0) + NVLINK_POINTS * nvlinks.get(pair, 0)
        counts[a, b] = nvlinks.get(pair, 0)
        codes[a, b] = f"NV{counts[a, b]}" if counts[a, b] else pcie.get(pair, "unknown")
    return Links(scores, dict(enumerate(numa)), counts, codes)


def halves(inner: dict) -> dict:
    """PCIe links of an 8-GPU node: ``inner`` within each half (given for 0-3, repeated for
    4-7), CrossCPU across."""
    out = {(a, b): CROSS for a in range(4) for b in range(4, 8)}
    for (a, b), kind in inner.items():
        out[a, b] = out[a + 4, b + 4] = kind
    return out


RTX8000 = node({(0, 3): 2, (1, 2): 2},
               {(0, 1): SAME, (2, 3): SAME, (0, 2): CROSS, (1, 3): CROSS},   # 0-3, 1-2: no PCIe link given
               [0, 0, 1, 1])
DGX1_PASCAL = node({p: 1 for p in [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6),
                                   (3, 7), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]},
                   halves({(0, 1): BRIDGE, (0, 2): SWITCH, (0, 3): BRIDGE, (1, 2): BRIDGE, (1, 3): SWITCH,
                           (2, 3): BRIDGE}),
                   [0, 0, 0, 0, 1, 1, 1, 1])
DGX1_VOLTA = node({(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
                   (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2},
                  halves({(0, 1): SWITCH, (0, 2): BRIDGE, (0, 3): BRIDGE, (1, 2): BRIDGE, (1, 3): BRIDGE,
                          (2, 3): SWITCH}),
                  [0, 0, 0, 0, 1, 1, 1, 1])
ALL = list(range(8))
