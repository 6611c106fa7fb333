"""How many NVLinks each simulated GPU has connected, for the counters and GPM metrics that
split its NVLink traffic over them (``nvlink``, ``gpm``) and for what a load may send: the
node's topology's links (``topology.SimTopology``), else the SKU's."""

from __future__ import annotations

__all__ = ["links_of"]


def links_of(facts, gpu) -> int:
    """How many of ``gpu``'s NVLinks lead somewhere (a GPU or an NVSwitch); none where NVML
    tells no topology (a virtual GPU: ``sim topology --gpu N off``)."""
    if not gpu.topology:
        return 0
    topology = facts.topology
    if topology is None:                 # a node made before the simulator had topologies
        return facts.skus[gpu.sku].nvlink_links
    return sum(far is not None for far in topology.links[gpu.index])
