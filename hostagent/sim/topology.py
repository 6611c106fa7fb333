"""The simulated node's topology, pure: PCIe paths, NUMA nodes and CPUs, NVLinks.

A profile describes each GPU by its NUMA node and its PCIe path (the host bridge, then the
switches from the top down), and its NVLinks by GPU pairs joined directly or by each GPU's
links to the NVSwitches. From that the model answers what NVML's topology calls answer
(``nvmlDeviceGetTopologyCommonAncestor``'s levels, the far end of each link) and what
``nvidia-smi topo -m`` prints. ``resolve`` turns a profile's section into the form the
node's facts keep (each GPU with its bus id and its SKU's links), so the model needs nothing
else.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..devices.topology import cpu_text

__all__ = ["SimTopology", "NvLink", "resolve", "cpu_list", "cpu_text", "INTERNAL", "SINGLE",
           "MULTIPLE", "HOSTBRIDGE", "NODE", "SYSTEM", "switch_bus_id"]

# nvmlGpuTopologyLevel_t (nvml.h).
INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = 0, 10, 20, 30, 40, 50


def switch_bus_id(n: int) -> str:
    """NVSwitch ``n``'s PCI address, as /proc/driver/nvidia-nvswitch/devices lists it."""
    return f"0000:{0xc0 + n:02x}:00.0"


def cpu_list(text: str) -> tuple[int, ...]:
    """``0-3,8`` -> (0, 1, 2, 3, 8): the kernel's cpulist notation."""
    out: list[int] = []
    for part in filter(None, str(text).split(",")):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return tuple(out)


def resolve(raw: dict, bus_ids: list[str], skus: list) -> dict:
    """A profile's ``topology`` section as the node's facts keep it: each GPU with its bus id,
    its SKU's NVLinks and their version."""
    gpus = [{**g, "bus_id": bus, "nvlinks": sku.nvlink_links, "nvlink_version": sku.nvlink_version}
            for g, bus, sku in zip(raw["gpus"], bus_ids, skus)]
    return {**raw, "gpus": gpus, "cpus": {str(k): v for k, v in raw["cpus"].items()}}


@dataclass(frozen=True)
class NvLink:
    """The far end of one NVLink: a GPU or an NVSwitch."""
    gpu: int | None = None
    switch: int | None = None


@dataclass(frozen=True)
class SimTopology:
    numa: tuple[int, ...]                    # per GPU; -1: the platform reports none
    pcie: tuple[tuple[str, ...], ...]        # per GPU: host bridge, then switches top down
    bus_ids: tuple[str, ...]                 # per GPU, as sysfs spells it
    cpus: dict[int, tuple[int, ...]]         # NUMA node -> its CPUs
    sockets: tuple[tuple[int, ...], ...]     # NUMA nodes of each socket
    links: tuple[tuple[NvLink | None, ...], ...]   # per GPU, by link number (None: not connected)
    nvlink_version: tuple[int, ...]          # per GPU, nvmlNvlinkVersion_t
    switch_device_id: int = 0

    @classmethod
    def from_dict(cls, raw: dict) -> "SimTopology":
        gpus = raw["gpus"]
        links: list[list[NvLink | None]] = [[] for _ in gpus]
        for pair, count in sorted((tuple(map(int, k.split("-"))), v) for k, v in (raw.get("nvlink") or {}).items()):
            a, b = pair
            links[a] += [NvLink(gpu=b)] * count
            links[b] += [NvLink(gpu=a)] * count
        switched = raw.get("nvswitch") or {}
        for i in range(len(gpus)):
            for s, count in enumerate(switched.get("links", ())):
                links[i] += [NvLink(switch=s)] * count
        for i, g in enumerate(gpus):
            if len(links[i]) > g["nvlinks"]:
                raise ValueError(f"GPU {i} has {len(links[i])} NVLinks connected, its SKU {g['nvlinks']}")
            links[i] += [None] * (g["nvlinks"] - len(links[i]))
        cpus = {int(k): cpu_list(v) for k, v in raw["cpus"].items()}
        sockets = raw.get("sockets") or [[n] for n in sorted(cpus)]
        return cls(numa=tuple(int(g["numa"]) for g in gpus), pcie=tuple(tuple(g["pcie"]) for g in gpus),
                   bus_ids=tuple(g["bus_id"].lower() for g in gpus), cpus=cpus,
                   sockets=tuple(tuple(s) for s in sockets), links=tuple(tuple(l) for l in links),
                   nvlink_version=tuple(int(g["nvlink_version"]) for g in gpus),
                   switch_device_id=int(switched.get("device_id", 0)))

    # ---- PCIe --------------------------------------------------------------------

    def level(self, a: int, b: int) -> int:
        """nvmlDeviceGetTopologyCommonAncestor: the farthest point the path from GPU ``a`` to
        GPU ``b`` crosses. Two switches crossed below one host bridge are MULTIPLE (PXB), one
        SINGLE (PIX)."""
        if self.numa[a] != self.numa[b]:
            return SYSTEM
        pa, pb = self.pcie[a], self.pcie[b]
        if pa[0] != pb[0]:
            return NODE
        if len(pa) < 2 or len(pb) < 2 or pa[1] != pb[1]:
            return HOSTBRIDGE
        return SINGLE if pa == pb else MULTIPLE

    def host_bridge(self, gpu: int) -> str:
        return self.pcie[gpu][0]

    # ---- NUMA and CPUs -------------------------------------------------------------

    def socket_of(self, gpu: int) -> tuple[int, ...]:
        """The NUMA nodes on GPU ``gpu``'s socket."""
        return next((s for s in self.sockets if self.numa[gpu] in s), (self.numa[gpu],))

    def node_cpus(self, nodes) -> tuple[int, ...]:
        return tuple(sorted(c for n in nodes for c in self.cpus.get(n, ())))

    def gpu_cpus(self, gpu: int) -> tuple[int, ...]:
        """The CPUs of GPU ``gpu``'s NUMA node (every CPU where the platform reports none)."""
        if self.numa[gpu] < 0:
            return self.node_cpus(self.cpus)
        return self.node_cpus((self.numa[gpu],))

    # ---- NVLink --------------------------------------------------------------------

    def nvlinks(self, a: int, b: int) -> int:
        """NVLinks between GPUs ``a`` and ``b``, as nvidia-smi counts them (``NV#``): links
        joining them directly, plus, through NVSwitches both reach, the links of the GPU
        with fewer into those switches (every pair of an HGX board: all its links)."""
        direct = sum(1 for link in self.links[a] if link and link.gpu == b)
        reach_a = [link.switch for link in self.links[a] if link and link.switch is not None]
        reach_b = [link.switch for link in self.links[b] if link and link.switch is not None]
        shared = set(reach_a) & set(reach_b)
        switched = min(sum(s in shared for s in reach_a), sum(s in shared for s in reach_b))
        return direct + switched


def sysfs_paths(topology: SimTopology) -> dict[str, str]:
    """Bus id -> the GPU's device folder under /sys/devices, through its host bridge, root
    port and switch ports, as the kernel nests them (``pci0000:3a/0000:3a:01.0/0000:3b:00.0``);
    /sys/bus/pci/devices/<bus id> links there, which is where the PCIe root is read from.
    A switch's upstream port takes the next bus after its host bridge's that no GPU uses."""
    gpu_buses = {int(b.split(":")[1], 16) for b in topology.bus_ids}
    ports: dict[tuple, str] = {}          # (parent, child) -> the port the child hangs off
    upstream: dict[str, int] = {}         # switch -> its upstream port's bus
    out = {}
    for gpu, path in enumerate(topology.pcie):
        root = path[0]
        domain, bus = root.removeprefix("pci").split(":")
        parts, parent = [root], root
        for hop in [*path[1:], topology.bus_ids[gpu]]:
            if (parent, hop) not in ports:
                siblings = sum(1 for p, _ in ports if p == parent)
                ports[parent, hop] = (f"{domain}:{bus}:{siblings + 1:02x}.0" if parent == root
                                      else f"{domain}:{upstream[parent] + 1:02x}:{siblings:02x}.0")
            parts.append(ports[parent, hop])
            if hop in path[1:]:
                if hop not in upstream:
                    taken = {b for s, b in upstream.items() for b in (b, b + 1)} | gpu_buses
                    upstream[hop] = next(b for b in range(int(bus, 16) + 1, 0xff)
                                         if b not in taken and b + 1 not in taken)
                parts.append(f"{domain}:{upstream[hop]:02x}:00.0")
            parent = hop
        out[topology.bus_ids[gpu]] = "/".join(parts + [topology.bus_ids[gpu]])
    return out
