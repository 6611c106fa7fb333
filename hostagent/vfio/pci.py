"""The node's NVIDIA GPUs as the PCI bus sees them, read from sysfs: which driver holds each,
its IOMMU group and the group's other functions, its NUMA node, BARs and VFIO cdev; and the
kernel's VFIO facts (IOMMU on, iommufd, vfio-pci loaded). NVML sees only GPUs the nvidia
driver holds; this sees them all, so a GPU passed through stays known.

A GPU is a function of vendor 0x10de and class 0x03xx that is not a virtual function (no
``physfn``), in PCI address order: go-nvlib's ``nvpci.GetGPUs``, whose order NVIDIA's DRA
driver numbers its vfio devices by.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..hostroot import HostRoot

__all__ = ["Function", "PciGpu", "VfioFacts", "read_gpus", "read_facts", "pci_names", "bar_bytes",
           "PCI_IDS_PATHS", "BRIDGE_CLASS"]

NVIDIA = "0x10de"
BRIDGE_CLASS = 0x06          # base class: host, ISA, PCI-to-PCI ... bridges
PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/pci.ids")
MEM_64 = 0x00100000          # IORESOURCE_MEM_64 in sysfs resource flags


@dataclass(frozen=True)
class Function:
    bdf: str
    vendor: str              # "0x10de"
    device: str              # "0x20b0"
    pci_class: int           # 0x030200
    driver: str              # "" when none holds it

    @property
    def bridge(self) -> bool:
        """A bridge of any kind: a PCIe port (0x0604), which vfio-pci does not take, or a host
        bridge (0x0600), which it would take, from the host."""
        return self.pci_class >> 16 == BRIDGE_CLASS


@dataclass(frozen=True)
class PciGpu:
    index: int               # its place among the node's NVIDIA GPUs, in PCI order
    function: Function
    iommu_group: int | None  # None: the IOMMU is off
    group: tuple[Function, ...]   # the group's other functions
    numa_node: int | None
    product: str             # pci.ids name ("GA100 [A100 SXM4 40GB]"), else the device id
    addressable_memory: int  # the 64-bit BARs, rounded up to a power of two (bytes)
    vfio_cdev: str | None    # "vfio0" while vfio-pci holds it on a node with VFIO cdevs

    @property
    def bdf(self) -> str:
        return self.function.bdf

    @property
    def driver(self) -> str:
        return self.function.driver

    @property
    def device_id(self) -> str:
        return self.function.device


@dataclass(frozen=True)
class VfioFacts:
    iommu: bool              # /sys/kernel/iommu_groups has groups
    iommufd: bool            # /dev/iommu exists
    vfio_pci: bool           # /sys/module/vfio_pci (the module is loaded)


def _read(path) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _function(host: HostRoot, bdf: str) -> Function:
    base = host.host(f"/sys/bus/pci/devices/{bdf}")
    try:
        driver = os.path.basename(os.readlink(base / "driver"))
    except OSError:
        driver = ""
    try:
        cls = int(_read(base / "class") or "0", 16)
    except ValueError:
        cls = 0
    return Function(bdf, _read(base / "vendor").lower(), _read(base / "device").lower(), cls, driver)


def bar_bytes(resource_text: str) -> int:
    """go-nvlib's ``GetTotalAddressableMemory(true)``: the sizes of the 64-bit memory BARs
    among BARs 0-5 of sysfs ``resource``, added and rounded up to a power of two."""
    total = 0
    for line in resource_text.splitlines()[:6]:
        try:
            start, end, flags = (int(x, 16) for x in line.split()[:3])
        except ValueError:
            continue
        if end > start and flags & MEM_64:
            total += end - start + 1
    return 1 << (total - 1).bit_length() if total else 0


def pci_names(host: HostRoot) -> dict[str, str]:
    """NVIDIA's device names from the host's ``pci.ids``: ``"0x20b0"`` -> name."""
    for path in PCI_IDS_PATHS:
        try:
            with open(host.host(path), errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        out, inside = {}, False
        for line in lines:
            if not line or line.startswith("#"):
                continue
            if not line.startswith("\t"):
                inside = line.split(None, 1)[0].lower() == "10de"
                continue
            if inside and not line.startswith("\t\t"):
                ident, _, name = line.strip().partition(" ")
                out[f"0x{ident.lower()}"] = name.strip()
        return out
    return {}


def read_facts(host: HostRoot) -> VfioFacts:
    groups = host.host("/sys/kernel/iommu_groups")
    try:
        iommu = any(groups.iterdir())
    except OSError:
        iommu = False
    return VfioFacts(iommu=iommu, iommufd=os.path.exists(host.host("/dev/iommu")),
                     vfio_pci=os.path.isdir(host.host("/sys/module/vfio_pci")))


def read_gpus(host: HostRoot) -> list[PciGpu]:
    """The node's NVIDIA GPUs, in PCI address order."""
    devices = host.host("/sys/bus/pci/devices")
    try:
        bdfs = sorted(p.name for p in devices.iterdir())
    except OSError:
        return []
    names = None
    out = []
    for bdf in bdfs:
        base = devices / bdf
        if _read(base / "vendor").lower() != NVIDIA or os.path.lexists(base / "physfn"):
            continue
        fn = _function(host, bdf)
        if fn.pci_class >> 16 != 0x03:
            continue
        try:
            group = int(os.path.basename(os.readlink(base / "iommu_group")))
        except (OSError, ValueError):
            group = None
        members: tuple[Function, ...] = ()
        if group is not None:
            folder = host.host(f"/sys/kernel/iommu_groups/{group}/devices")
            try:
                members = tuple(_function(host, b) for b in sorted(p.name for p in folder.iterdir()) if b != bdf)
            except OSError:
                members = ()
        try:
            numa = int(_read(base / "numa_node"))
        except ValueError:
            numa = None
        try:
            cdev = next(iter(sorted(p.name for p in (base / "vfio-dev").iterdir())), None)
        except OSError:
            cdev = None
        if names is None:
            names = pci_names(host)
        out.append(PciGpu(len(out), fn, group, members, None if numa is None or numa < 0 else numa,
                          names.get(fn.device, fn.device), bar_bytes(_read(base / "resource")), cdev))
    return out
