"""``hostagent node``: driver and library versions, and the host paths in use."""

from __future__ import annotations

from .common import host_from_args
from .output import add_output_flag, emit, table

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("node", help="show driver, CUDA and NVML versions and host paths")
    add_output_flag(p)
    p.set_defaults(run=run)


def run(args) -> int:
    """The inventory's part of the API's ``Node`` (``hostagent.model``)."""
    import os

    from ..devices import read_inventory
    from ..model import node
    inv = read_inventory(host_from_args(args))
    data = node(inv, hostname=os.uname().nodename, simulated=inv.simulated)

    def render(d):
        rows = [[k.replace("_", " "), v] for k, v in d.items() if k != "paths"]
        rows += [[f"{k.replace('_', ' ')}", v] for k, v in d["paths"].items()]
        print(table(["FIELD", "VALUE"], rows))
        if d["device_nodes"] == "regular-files":
            print("\nnote: device nodes are regular files (the simulated node was created without "
                  "the right to create device nodes)")

    emit(data, args.output, render)
    return 0
