"""``hostagent topo``: how the node's GPUs are connected, in ``nvidia-smi topo -m``'s notation
(so the two can be compared line by line), with the legend; ``-o json|yaml``: each GPU and
each pair of GPUs (link type and NVLink count)."""

from __future__ import annotations

import sys

from ..errors import UsageError
from .common import host_from_args
from .output import add_output_flag, emit

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("topo", help="show how the GPUs are connected (NVLink, PCIe, NUMA)",
                       description="The GPU topology matrix as nvidia-smi topo -m prints it: each "
                                   "pair's NVLinks (NV#) or PCIe level (PIX, PXB, PHB, NODE, SYS), "
                                   "each GPU's CPU and NUMA affinity.")
    p.add_argument("gpus", nargs="*", metavar="GPU", help="GPU indices or UUIDs (default: every GPU)")
    add_output_flag(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..devices import read_inventory
    from ..topology.matrix import document, select_gpus, text
    inventory = read_inventory(host_from_args(args))
    try:
        indices = select_gpus(inventory, args.gpus)
    except KeyError as e:
        raise UsageError(f"no GPU {e.args[0]!r} on this node",
                         hint="name GPUs by index or UUID, as 'hostagent devices' lists them") from None
    data = document(inventory, indices)
    for gpu in data["gpus"]:
        if gpu["error"]:
            print(f"hostagent: note: GPU {gpu['index']}'s links are unknown ({gpu['error']})", file=sys.stderr)
    emit(data, args.output, lambda d: print(text(inventory, indices), end=""))
    return 0
