"""The fake NVML's topology calls: PCIe ancestry, peer-to-peer status, NVLinks, affinity.

Registered (``cfuncs.nvml``) on ``FakeNvmlLibrary`` like the functions in ``fakenvml`` (each takes the
library first); the answers come from the node's ``SimTopology`` (sim/topology.py). Where
nvml.h leaves a case open the choice is noted (docs/simulator.md lists them):

* the topology calls answer ``NOT_SUPPORTED`` on a MIG device handle, on a GPU made to fail
  them (``sim topology --gpu N off``, as a virtual GPU's driver does) and on a node made
  before the simulator had a topology;
* ``nvmlDeviceGetTopologyCommonAncestor`` of a GPU with itself is ``INVALID_ARGUMENT``;
* ``nvmlDeviceGetTopologyNearestGpus`` lists the GPUs at the given level or nearer;
* peer-to-peer reads, writes and PCI access are ``OK`` over NVLink and over PCIe within a NUMA
  node, ``CHIPSET_NOT_SUPPORTED`` across NUMA nodes; atomics only over NVLink;
* a GPU without NVLink answers the NVLink calls ``NOT_SUPPORTED``, a link past its SKU's
  count ``INVALID_ARGUMENT``; an unconnected link is disabled, its remote PCI info
  ``NOT_SUPPORTED`` and its remote type ``UNKNOWN``;
* ``nvmlDeviceGetNumaNodeId`` is ``NOT_SUPPORTED``: no simulated GPU's memory is a NUMA node
  (nvidia-smi's "GPU NUMA ID" is N/A).
"""

from __future__ import annotations

import ctypes
from ctypes import c_uint, c_ulonglong, c_void_p, sizeof

import pynvml as N

from .cfuncs import P, normal_bus_id, nvml, put, sized, struct
from .node import SimNvmlError
from .topology import switch_bus_id

__all__ = ["P2P_OK_WITHIN", "WORD_BITS"]

WORD_BITS = 64                       # cpuSet/nodeSet words: unsigned long on Linux x86_64
P2P_OK_WITHIN = N.NVML_TOPOLOGY_NODE  # PCIe peer access works up to this level (the choice above)
_NOT_SUPPORTED = N.NVML_ERROR_NOT_SUPPORTED


def _placed(lib, handle):
    """(state, gpu, topology) for a GPU whose topology NVML can tell."""
    state, gpu = lib._gpu_only(handle)
    topology = lib.facts.topology
    if topology is None or not gpu.topology:
        raise SimNvmlError(_NOT_SUPPORTED, "no topology for this GPU")
    return state, gpu, topology


def _put_handles(lib, indices, count_ptr, array) -> None:
    if not sized(count_ptr, array, len(indices), "device"):
        return
    for i, index in enumerate(indices):
        put(array + i * sizeof(c_void_p), c_void_p, lib._handle("gpu", index))


def _placeable(state, index: int) -> bool:
    gpu = state.gpus[index]
    return gpu.topology and not gpu.lost


def _put_bits(ptr: int, words: int, bits) -> None:
    """A bit set in ``words`` unsigned longs; bits past them are cut, as a short buffer is."""
    value = 0
    for bit in bits:
        value |= 1 << bit
    for w in range(words):
        put(ptr + w * sizeof(c_ulonglong), c_ulonglong, (value >> (w * WORD_BITS)) & (2 ** WORD_BITS - 1))


# ---- PCIe ancestry and peer access ------------------------------------------------

@nvml(P, P, P)
def nvmlDeviceGetTopologyCommonAncestor(self, first, second, ptr):
    _, a, topology = _placed(self, first)
    _, b, _ = _placed(self, second)
    if a.index == b.index:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "the same GPU twice")
    put(ptr, c_uint, topology.level(a.index, b.index))


@nvml(P, c_uint, P, P)
def nvmlDeviceGetTopologyNearestGpus(self, handle, level, count_ptr, array):
    state, gpu, topology = _placed(self, handle)
    near = [i for i in range(len(state.gpus)) if i != gpu.index and _placeable(state, i)
            and topology.level(gpu.index, i) <= level]
    _put_handles(self, near, count_ptr, array)


@nvml(c_uint, P, P)
def nvmlSystemGetTopologyGpuSet(self, cpu, count_ptr, array):
    state, topology = self._state(), self.facts.topology
    if topology is None:
        raise SimNvmlError(_NOT_SUPPORTED, "no topology")
    near = [i for i in range(len(state.gpus)) if _placeable(state, i) and cpu in topology.gpu_cpus(i)]
    _put_handles(self, near, count_ptr, array)


@nvml(P, P, c_uint, P)
def nvmlDeviceGetP2PStatus(self, first, second, index, ptr):
    _, a, topology = _placed(self, first)
    _, b, _ = _placed(self, second)
    if index >= N.NVML_P2P_CAPS_INDEX_UNKNOWN:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad P2P capability {index}")
    nvlinked = a.index != b.index and topology.nvlinks(a.index, b.index) > 0
    if index in (N.NVML_P2P_CAPS_INDEX_NVLINK, N.NVML_P2P_CAPS_INDEX_ATOMICS):
        status = N.NVML_P2P_STATUS_OK if nvlinked else N.NVML_P2P_STATUS_NOT_SUPPORTED
    elif nvlinked or a.index == b.index or topology.level(a.index, b.index) <= P2P_OK_WITHIN:
        status = N.NVML_P2P_STATUS_OK
    else:
        status = N.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
    put(ptr, c_uint, status)


# ---- CPU and memory affinity --------------------------------------------------------

def _scope_nodes(topology, index: int, scope: int) -> tuple[int, ...]:
    if scope == N.NVML_AFFINITY_SCOPE_NODE:
        return (topology.numa[index],) if topology.numa[index] >= 0 else tuple(topology.cpus)
    if scope == N.NVML_AFFINITY_SCOPE_SOCKET:
        return topology.socket_of(index) if topology.numa[index] >= 0 else tuple(topology.cpus)
    raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad affinity scope {scope}")


@nvml(P, c_uint, P)
def nvmlDeviceGetCpuAffinity(self, handle, words, ptr):
    _, gpu, topology = _placed(self, handle)
    _put_bits(ptr, words, topology.gpu_cpus(gpu.index))


@nvml(P, c_uint, P, c_uint)
def nvmlDeviceGetCpuAffinityWithinScope(self, handle, words, ptr, scope):
    _, gpu, topology = _placed(self, handle)
    _put_bits(ptr, words, topology.node_cpus(_scope_nodes(topology, gpu.index, scope)))


@nvml(P, c_uint, P, c_uint)
def nvmlDeviceGetMemoryAffinity(self, handle, words, ptr, scope):
    _, gpu, topology = _placed(self, handle)
    _put_bits(ptr, words, _scope_nodes(topology, gpu.index, scope))


@nvml(P, P)
def nvmlDeviceGetNumaNodeId(self, handle, ptr):
    _placed(self, handle)
    raise SimNvmlError(_NOT_SUPPORTED, "the GPU's memory is not a NUMA node")


# ---- NVLink -----------------------------------------------------------------------

def _link(lib, handle, link: int):
    """(gpu, topology, the far end or None) of one of the GPU's NVLinks."""
    _, gpu, topology = _placed(lib, handle)
    links = topology.links[gpu.index]
    if not links:
        raise SimNvmlError(_NOT_SUPPORTED, "the GPU has no NVLink")
    if link >= len(links):
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"the GPU has {len(links)} NVLinks")
    return gpu, topology, links[link]


@nvml(P, c_uint, P)
def nvmlDeviceGetNvLinkState(self, handle, link, ptr):
    _, _, far = _link(self, handle, link)
    put(ptr, c_uint, N.NVML_FEATURE_ENABLED if far else N.NVML_FEATURE_DISABLED)


@nvml(P, c_uint, P)
def nvmlDeviceGetNvLinkVersion(self, handle, link, ptr):
    gpu, topology, _ = _link(self, handle, link)
    put(ptr, c_uint, topology.nvlink_version[gpu.index])


@nvml(P, c_uint, c_uint, P)
def nvmlDeviceGetNvLinkCapability(self, handle, link, capability, ptr):
    _, _, far = _link(self, handle, link)
    if capability >= N.NVML_NVLINK_CAP_COUNT:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad capability {capability}")
    offered = (N.NVML_NVLINK_CAP_P2P_SUPPORTED, N.NVML_NVLINK_CAP_P2P_ATOMICS, N.NVML_NVLINK_CAP_VALID)
    put(ptr, c_uint, int(far is not None and capability in offered))


@nvml(P, c_uint, P)
def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle, link, ptr):
    _, topology, far = _link(self, handle, link)
    if far is None:
        raise SimNvmlError(_NOT_SUPPORTED, "the link is not connected")
    if far.gpu is not None:
        bus = self._state().gpus[far.gpu].pci_bus_id
        device_id = self.facts.skus[self._state().gpus[far.gpu].sku].pci_device_id
    else:
        bus, device_id = switch_bus_id(far.switch), topology.switch_device_id
    info = struct(ptr, N.nvmlPciInfo_t)
    ctypes.memset(ptr, 0, sizeof(N.nvmlPciInfo_t))     # pciSubSystemId is not filled (nvml.h)
    domain, bus_no, rest = bus.split(":")
    nvml_id = normal_bus_id(bus).encode()
    info.busIdLegacy = info.busId = nvml_id
    info.domain, info.bus, info.device = int(domain, 16), int(bus_no, 16), int(rest.split(".")[0], 16)
    info.pciDeviceId = device_id


@nvml(P, c_uint, P)
def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link, ptr):
    _, _, far = _link(self, handle, link)
    kind = (N.NVML_NVLINK_DEVICE_TYPE_UNKNOWN if far is None else
            N.NVML_NVLINK_DEVICE_TYPE_GPU if far.gpu is not None else N.NVML_NVLINK_DEVICE_TYPE_SWITCH)
    put(ptr, c_uint, kind)
