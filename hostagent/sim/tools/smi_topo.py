"""``nvidia-smi topo`` of the simulated node, from its topology model (sim/topology.py).

* ``-m``/``--matrix``: each GPU pair's link (``NV#`` over NVLink, else the PCIe level: PIX,
  PXB, PHB, NODE, SYS), then per GPU its CPU Affinity, NUMA Affinity and GPU NUMA ID (N/A:
  no simulated GPU's memory is a NUMA node), tab-separated, then the legend, as drivers of
  R535 and later print them (NIC columns are not simulated);
* ``-mp``/``--matrix_pci``: the same with PCIe levels only (no ``NV#``);
* ``-p2p r|w|n|a|p``: peer-to-peer read, write, NVLink, atomics or PCI status (OK, CNS, NS)
  with its legend.

A GPU whose topology NVML refuses (``sim topology --gpu N off``) shows ``N/A``.
"""

from __future__ import annotations

from ...topology.matrix import legend_lines
from ..faketopology import P2P_OK_WITHIN
from ..topology import cpu_text

__all__ = ["topo"]

_CODES = {10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_LEGEND = ("", "Legend:", "", "  X    = Self", "  OK   = Status Ok", "  CNS  = Chipset not supported",
              "  GNS  = GPU not supported", "  TNS  = Topology not supported", "  NS   = Not supported",
              "  DR   = Disabled by regkey", "  U    = Unknown")
P2P_KINDS = {"r": "read", "w": "write", "n": "nvlink", "a": "atomics", "p": "prop"}


def topo(store, state, opts: dict, fail) -> int:
    """``fail(code, message)`` raises the tool's exit."""
    modes = [k for k in ("matrix", "matrix_pci", "p2p") if k in opts]
    if len(modes) != 1 or (modes[0] == "p2p" and opts["p2p"] not in P2P_KINDS):
        fail(2, "Invalid combination of input arguments. Please run 'nvidia-smi topo -h' for help.")
    model = store.facts.topology
    gpus = [g.index for g in state.gpus]
    known = {g.index for g in state.gpus if model is not None and g.topology}
    if modes[0] == "p2p":
        print(_p2p(model, gpus, known, opts["p2p"]))
        return 0
    nvlink = modes[0] == "matrix"
    rows = ["\t" + "\t".join(f"GPU{i}" for i in gpus) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a in gpus:
        cells = "\t".join(_cell(model, known, a, b, nvlink) for b in gpus)
        if a in known:
            numa = model.numa[a]
            rows.append(f"GPU{a}\t{cells}\t{cpu_text(model.gpu_cpus(a))}\t{numa if numa >= 0 else 'N/A'}\t\tN/A")
        else:
            rows.append(f"GPU{a}\t{cells}\tN/A\tN/A\t\tN/A")
    legend = legend_lines() if nvlink else legend_lines()[:-1]
    print("\n".join(rows + [""] + legend))
    return 0


def _cell(model, known, a: int, b: int, nvlink: bool) -> str:
    if a == b:
        return " X "
    if a not in known or b not in known:
        return "N/A"
    links = model.nvlinks(a, b) if nvlink else 0
    return f"NV{links}" if links else _CODES[model.level(a, b)]


def _p2p(model, gpus, known, kind: str) -> str:
    rows = [" \t" + "\t".join(f"GPU{i}" for i in gpus) + "\t"]
    for a in gpus:
        cells = []
        for b in gpus:
            if a == b:
                cells.append("X")
            elif a not in known or b not in known:
                cells.append("U")
            elif model.nvlinks(a, b):
                cells.append("OK")
            elif kind in ("n", "a"):
                cells.append("NS")
            else:
                cells.append("OK" if model.level(a, b) <= P2P_OK_WITHIN else "CNS")
        rows.append(f" GPU{a}\t" + "\t".join(cells) + "\t")
    return "\n".join(rows + list(P2P_LEGEND))
