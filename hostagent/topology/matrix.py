"""The node's GPU topology for people and programs, from the inventory's ``Topology``: the
matrix in ``nvidia-smi topo -m``'s notation (tab-separated, as the tool prints it, so the two
can be compared line by line) with its legend, and a JSON document with each GPU and each
pair of GPUs.
"""

from __future__ import annotations

from .. import model
from ..devices.records import UNKNOWN, Inventory

__all__ = ["LEGEND", "document", "text", "select_gpus"]

# nvidia-smi topo -m's legend, as drivers of R450 and later print it.
LEGEND = (
    ("X", "Self"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
    ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks"),
)


def legend_lines() -> list[str]:
    return ["Legend:", ""] + [f"  {code:<4} = {meaning}" for code, meaning in LEGEND]


def select_gpus(inventory: Inventory, wanted: list[str] | None) -> list[int]:
    """Indices of the GPUs ``wanted`` names (index or UUID), all readable ones for None;
    raises KeyError naming the first that is no GPU of the node."""
    gpus = {str(g.index): g.index for g in inventory.gpus} | {g.uuid: g.index for g in inventory.gpus}
    if not wanted:
        return [g.index for g in inventory.gpus]
    out = []
    for name in wanted:
        if name.strip() not in gpus:
            raise KeyError(name)
        out.append(gpus[name.strip()])
    return sorted(set(out))


def _cell(inventory: Inventory, a: int, b: int) -> str:
    if a == b:
        return " X "
    link = inventory.topology.link(a, b) if inventory.topology else None
    return link.code if link and link.code != UNKNOWN else "N/A"


def text(inventory: Inventory, indices: list[int]) -> str:
    """The matrix of GPUs ``indices``, each row with its CPU and NUMA affinity, and the legend."""
    topology = inventory.topology
    head = "\t" + "\t".join(f"GPU{i}" for i in indices) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [head]
    for a in indices:
        place = topology.gpu(a) if topology else None
        cpus = place.cpu_affinity if place and place.cpu_affinity else "N/A"
        nodes = place.numa_affinity if place and place.numa_affinity else "N/A"
        cells = "\t".join(_cell(inventory, a, b) for b in indices)
        rows.append(f"GPU{a}\t{cells}\t{cpus}\t{nodes}\t\tN/A")
    return "\n".join(rows + [""] + legend_lines()) + "\n"


_NOT_READ = {"cpu_affinity": None, "numa_affinity": None, "nvlinks": None, "nvswitch_links": 0,
             "error": "topology not read"}


def document(inventory: Inventory, indices: list[int]) -> dict:
    """Each GPU (index, UUID, PCIe root, NUMA node, affinity, NVLinks, why unknown) and each
    pair of them (``link`` in nvidia-smi's notation, the NVLink count, the PCIe level)."""
    topology = inventory.topology
    chosen = set(indices)
    gpus = []
    for gpu in inventory.gpus:
        if gpu.index not in chosen:
            continue
        place = topology.gpu(gpu.index) if topology else None
        gpus.append({"index": gpu.index, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id,
                     "pcie_root": gpu.pcie_root, "numa_node": gpu.numa_node,
                     **(model.gpu_place(place) if place else _NOT_READ)})
    pairs = [{"gpus": list(link.gpus), "link": link.code, "nvlinks": link.nvlinks, "pcie": link.pcie}
             for link in (topology.links if topology else ()) if set(link.gpus) <= chosen]
    return {"gpus": gpus, "pairs": pairs, "legend": dict(LEGEND)}
