"""``hostagent labels``: the node's GPU feature labels (gpu-feature-discovery compatible)."""

from __future__ import annotations

import time

from .common import host_from_args

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("labels", help="print (or write) the node's GPU feature labels",
                       description="Labels compatible with gpu-feature-discovery, one key=value per line.")
    p.add_argument("--mig-strategy", choices=["none", "single", "mixed"], default="none")
    p.add_argument("--sharing-strategy", choices=["none", "time-slicing", "mps"], default="none")
    p.add_argument("--replicas", type=int, default=1, help="replicas per GPU when shared")
    p.add_argument("--no-timestamp", action="store_true", help="leave out nvidia.com/gfd.timestamp")
    p.add_argument("--write", action="store_true",
                   help="write them to NFD's local features file (only if they changed)")
    p.add_argument("-o", "--output", choices=["nfd", "json", "yaml"], default="nfd")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..devices import read_inventory
    from ..errors import UsageError
    from ..labels import FEATURES_FILE, Sharing, node_labels, render, write_labels
    from ..labels.hostfacts import gpu_mode, machine_type
    from .output import emit
    if args.replicas < 1 or (args.sharing_strategy != "none" and args.replicas < 2):
        raise UsageError("--replicas must be at least 2 for a sharing strategy, 1 without")
    host = host_from_args(args)
    inv = read_inventory(host)
    labels = node_labels(inv, mig_strategy=args.mig_strategy,
                         sharing=Sharing(args.sharing_strategy, args.replicas),
                         machine=machine_type(host), gpu_mode=gpu_mode(host, inv),
                         timestamp=None if args.no_timestamp or args.write else int(time.time()))
    if args.write:
        written = write_labels(host, labels)
        print(f"{host.host(FEATURES_FILE)}: {'written' if written else 'unchanged'}")
        return 0
    if args.output == "nfd":
        print(render(labels), end="")
    else:
        emit(labels, args.output, None)
    return 0
