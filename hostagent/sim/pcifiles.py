"""The PCI facts of a simulated node that the bus never changes: the functions beside the
GPUs (an HD-audio function at ``.1`` of a board with display outputs), each function's IOMMU
group, the GPUs' BARs (sysfs ``resource``) and the ``pci.ids`` names lspci and go-nvlib show.

IOMMU groups: each GPU is alone in its group, as on a DGX (cluster-and-passthrough.md F),
but for a function beside it, which shares its group. Group numbers are the simulator's
choice (24 upwards, in PCI order).
"""

from __future__ import annotations

from .catalog import NodeProfile

__all__ = ["functions_and_groups", "resource_text", "write_functions", "write_pci_ids", "PCI_IDS",
           "AUDIO_CLASS"]

PCI_IDS = "usr/share/misc/pci.ids"      # Debian's place (hwdata's /usr/share/hwdata on EL)
AUDIO_CLASS = "0x040300"                 # multimedia, HD audio
FIRST_GROUP = 24
# sysfs resource flags as lspci's machines show them: a 32-bit memory BAR, a 64-bit
# prefetchable one (IORESOURCE_MEM_64, 0x100000, set).
MEM32 = 0x00040200
MEM64_PREFETCH = 0x0014220C


def _audio_bdf(bdf: str) -> str:
    return bdf.rsplit(".", 1)[0] + ".1"


def functions_and_groups(profile: NodeProfile) -> dict:
    """The node facts ``functions`` and ``iommu_groups`` of a profile."""
    functions, groups = {}, {}
    for index, slot in enumerate(profile.gpus):
        group = FIRST_GROUP + index
        groups[slot.pci_bus_id] = group
        if slot.audio:
            from .catalog import raw_skus
            audio = raw_skus()[slot.sku.key]["audio"]
            bdf = _audio_bdf(slot.pci_bus_id)
            functions[bdf] = {"vendor": "0x10de", "device": f"0x{int(audio['device']):04x}", "class": AUDIO_CLASS,
                              "gpu": index, "name": audio["pci_name"]}
            groups[bdf] = group
    return {"functions": functions, "iommu_groups": groups}


def resource_text(memory_mib: int) -> str:
    """sysfs ``resource``: BAR0 16 MiB of registers (32-bit), BAR1 the framebuffer window
    (64-bit, prefetchable: the board's memory rounded up to a power of two, as the large
    BAR1 of data-center boards), BAR3 32 MiB (64-bit); then the unused BARs, the ROM and the
    bridge windows as zeros. The sizes are inferred; the layout is the kernel's."""
    bar1 = 1 << max(0, (memory_mib * 2 ** 20 - 1).bit_length())
    bars = [(0xfa000000, 16 << 20, MEM32), (0x38000000000, bar1, MEM64_PREFETCH), None,
            (0x38000000000 + bar1, 32 << 20, MEM64_PREFETCH), None, None]
    lines = []
    for bar in bars + [None] * 7:
        if bar is None:
            lines.append("0x0000000000000000 0x0000000000000000 0x0000000000000000")
        else:
            start, size, flags = bar
            lines.append(f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}")
    return "\n".join(lines) + "\n"


def write_functions(w, functions: dict, folders: dict) -> None:
    """Each function's sysfs folder beside its GPU's, linked from /sys/bus/pci/devices."""
    from ..fileio import ensure_dir
    for bdf, info in functions.items():
        pci = f"sys/bus/pci/devices/{bdf}"
        gpu_bdf = bdf.rsplit(".", 1)[0] + ".0"
        if gpu_bdf in folders:
            folder = folders[gpu_bdf].rsplit("/", 1)[0] + "/" + bdf
            ensure_dir(w.root / "sys/devices" / folder)
            w.link(pci, f"../../../devices/{folder}")
        w.file(f"{pci}/vendor", f"{info['vendor']}\n", mode=0o444)
        w.file(f"{pci}/device", f"{info['device']}\n", mode=0o444)
        w.file(f"{pci}/class", f"{info['class']}\n", mode=0o444)
        w.file(f"{pci}/numa_node", (w.root / f"sys/bus/pci/devices/{gpu_bdf}/numa_node").read_text(), mode=0o444)


def write_pci_ids(w, profile: NodeProfile) -> None:
    """A ``pci.ids`` with NVIDIA's entries for the node's devices, in the database's format
    (a vendor line, then a tab and each device's id and name)."""
    from .catalog import raw_skus
    devices = {}
    for slot in profile.gpus:
        raw = raw_skus()[slot.sku.key]
        if raw.get("pci_name"):
            devices[slot.sku.pci_device_id >> 16] = raw["pci_name"]
        if slot.audio:
            devices[int(raw["audio"]["device"])] = raw["audio"]["pci_name"]
    lines = ["# pci.ids: the NVIDIA entries of the PCI ID database for this node's devices", "#",
             "10de  NVIDIA Corporation"] + [f"\t{d:04x}  {name}" for d, name in sorted(devices.items())]
    w.file(PCI_IDS, "\n".join(lines) + "\n")
