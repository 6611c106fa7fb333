"""Read how the node's GPUs are connected, through pynvml, into a ``Topology`` record.

Per GPU: its CPU and memory affinity, its active NVLinks and where each leads (a GPU or an
NVSwitch); its PCIe root (``pcie_root``, from sysfs, as Kubernetes'
``resource.kubernetes.io/pcieRoot`` is derived) is read with the GPU's record. Per pair of GPUs: ``nvmlDeviceGetTopologyCommonAncestor``'s PCIe level and the
NVLinks between them, those through NVSwitches counted as nvidia-smi counts them (the links
of the GPU with fewer into the switches both reach: every pair of an HGX board has all its
links). What NVML will not tell is ``unknown``, never guessed: a GPU whose ancestry NVML
refuses with every other GPU (a virtual GPU, an old driver) has its ``error`` set, and its
links, NVLinks included, are unknown.
"""

from __future__ import annotations

import os
import re
from collections import Counter

import pynvml as N

from ..hostroot import HostRoot
from .records import PCIE_LEVELS, UNKNOWN, Gpu, GpuLink, GpuTopology, Topology, sysfs_bus_id

__all__ = ["read_topology", "pcie_root", "bits", "cpu_text"]

CPU_WORDS = 64          # cpuSet words (unsigned long): 4096 CPUs
NODE_WORDS = 4          # nodeSet words: 256 NUMA nodes
_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def bits(words, width: int = 64) -> list[int]:
    """The set bits of NVML's cpuSet/nodeSet words."""
    out = []
    for w, word in enumerate(words):
        while word:
            low = word & -word
            out.append(w * width + low.bit_length() - 1)
            word ^= low
    return out


def cpu_text(cpus) -> str:
    """[0, 1, 2, 5] -> "0-2,5", the kernel's and nvidia-smi's notation."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def pcie_root(host: HostRoot, nvml_bus_id: str) -> str | None:
    """The PCIe root (``pci0000:3a``) of a device: the first folder under /sys/devices its
    /sys/bus/pci/devices link leads to (Kubernetes' deviceattribute derivation); None where
    the link is missing or leads elsewhere."""
    bdf = sysfs_bus_id(nvml_bus_id)
    try:
        target = os.readlink(host.sys("bus/pci/devices") / bdf)
    except OSError:
        return None
    parts = [p for p in target.split("/") if p not in ("", ".", "..")]
    if "devices" not in parts or parts[-1] != bdf:
        return None
    root = parts[parts.index("devices") + 1] if parts.index("devices") + 1 < len(parts) else ""
    return root if _ROOT.fullmatch(root) else None


def _affinity(h) -> tuple[str | None, str | None] | str:
    """(CPUs, NUMA nodes) near the GPU, or why NVML would not say."""
    try:
        cpus = bits(N.nvmlDeviceGetCpuAffinity(h, CPU_WORDS))
        nodes = bits(N.nvmlDeviceGetMemoryAffinity(h, NODE_WORDS, N.NVML_AFFINITY_SCOPE_NODE))
    except N.NVMLError as e:
        return f"nvmlDeviceGetCpuAffinity: {e}"
    return cpu_text(cpus) or None, cpu_text(nodes) or None


def _nvlinks(h, gpu_at: dict[str, int]) -> tuple[Counter, Counter]:
    """This GPU's active NVLinks: (GPU index -> links to it, NVSwitch bus id -> links to it).
    NOT_SUPPORTED on the first link: the GPU has none; INVALID_ARGUMENT: past its last (links
    are numbered densely). A remote type NVML cannot give (an older driver) is told by the
    far end's bus id."""
    gpus, switches = Counter(), Counter()
    for link in range(N.NVML_NVLINK_MAX_LINKS):
        try:
            if N.nvmlDeviceGetNvLinkState(h, link) != N.NVML_FEATURE_ENABLED:
                continue
        except N.NVMLError as e:
            if e.value in (N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_INVALID_ARGUMENT):
                break
            raise
        bus = sysfs_bus_id(_text(N.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
        try:
            kind = N.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
        except N.NVMLError_FunctionNotFound:
            kind = N.NVML_NVLINK_DEVICE_TYPE_GPU if bus in gpu_at else N.NVML_NVLINK_DEVICE_TYPE_SWITCH
        if kind == N.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switches[bus] += 1
        elif bus in gpu_at:
            gpus[gpu_at[bus]] += 1
    return gpus, switches


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ancestry(gpus) -> tuple[dict[tuple[int, int], str], dict[int, str], Counter]:
    """Each pair's PCIe level; for each GPU the first refusal, and how many pairs NVML refused."""
    levels: dict[tuple[int, int], str] = {}
    refusals: dict[int, str] = {}
    refused = Counter()
    for i, (a, ha) in enumerate(gpus):
        for b, hb in gpus[i + 1:]:
            try:
                levels[a.index, b.index] = PCIE_LEVELS.get(N.nvmlDeviceGetTopologyCommonAncestor(ha, hb), UNKNOWN)
            except N.NVMLError as e:
                levels[a.index, b.index] = UNKNOWN
                refused.update((a.index, b.index))
                for gpu in (a.index, b.index):
                    refusals.setdefault(gpu, f"nvmlDeviceGetTopologyCommonAncestor: {e}")
    return levels, refusals, refused


def read_topology(gpus: list[tuple[Gpu, object]]) -> Topology:
    """``gpus``: each readable GPU with its NVML handle."""
    levels, refusals, refused = _ancestry(gpus)
    affinity = {gpu.index: _affinity(h) for gpu, h in gpus}
    # A GPU is unplaced when NVML refuses its affinity, or its ancestry with every other GPU
    # of three or more (of two, either may be the one NVML cannot place).
    errors = {i: why for i, why in refusals.items()
              if isinstance(affinity[i], str) or len(gpus) > 2 and refused[i] == len(gpus) - 1}
    for i, why in affinity.items():
        if isinstance(why, str):
            errors.setdefault(i, why)
    gpu_at = {sysfs_bus_id(g.pci_bus_id): g.index for g, _ in gpus}
    direct: dict[int, Counter] = {}
    switched: dict[int, Counter] = {}
    for gpu, h in gpus:
        if gpu.index not in errors:
            try:
                direct[gpu.index], switched[gpu.index] = _nvlinks(h, gpu_at)
            except N.NVMLError as e:
                errors[gpu.index] = f"nvmlDeviceGetNvLinkState: {e}"
    records = []
    for gpu, _ in gpus:
        known = gpu.index not in errors
        cpus, nodes = affinity[gpu.index] if not isinstance(affinity[gpu.index], str) else (None, None)
        records.append(GpuTopology(
            index=gpu.index, cpu_affinity=cpus,
            numa_affinity=nodes, error=errors.get(gpu.index),
            nvlinks=sum(direct[gpu.index].values()) + sum(switched[gpu.index].values()) if known else None,
            nvswitch_links=sum(switched[gpu.index].values()) if known else 0))
    links = []
    for (a, b), pcie in levels.items():
        if a in errors or b in errors:
            links.append(GpuLink((a, b), UNKNOWN, None))
            continue
        shared = set(switched[a]) & set(switched[b])
        through = min(sum(switched[a][s] for s in shared), sum(switched[b][s] for s in shared))
        links.append(GpuLink((a, b), pcie, min(direct[a][b], direct[b][a]) + through))
    return Topology(gpus=tuple(records), links=tuple(links))
