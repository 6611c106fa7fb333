"""``hostagent labels``: the node's GPU feature labels (gpu-feature-discovery compatible).

When the daemon runs it keeps the labels (and NFD's features file) from its config's
``labels:`` section, so the command shows the daemon's labels (``GET /v1/labels``) and
refuses ``--write``: a second writer would be undone at the daemon's next rewrite. Options
that change how labels are computed compute them here instead, as a preview.
"""

from __future__ import annotations

import sys
import time

from .common import daemon_client, host_from_args, running_daemon_socket

__all__ = ["register"]

# Options that change the labels; given any, they are computed here (defaults as GFD's).
_COMPUTE = ("mig_strategy", "sharing_strategy", "replicas")


def register(sub) -> None:
    p = sub.add_parser("labels", help="print (or write) the node's GPU feature labels",
                       description="Labels compatible with gpu-feature-discovery, one key=value per "
                                   "line. With the daemon running: its labels, unless options say "
                                   "how to compute them here.")
    p.add_argument("--mig-strategy", choices=["none", "single", "mixed"],
                   help="as GFD's --mig-strategy (default: the labels section's mig_strategy, else the "
                        "sharing configuration's flags.migStrategy, else none)")
    p.add_argument("--sharing-strategy", choices=["none", "time-slicing", "mps"],
                   help="how GPUs are shared (default: the sharing hostagent has in force, else none)")
    p.add_argument("--replicas", type=int, help="replicas per device when shared (at least 2)")
    p.add_argument("--no-timestamp", action="store_true", help="leave out nvidia.com/gfd.timestamp")
    p.add_argument("--write", action="store_true",
                   help="write them to NFD's local features file (only if they changed); "
                        "refused while the daemon runs, which keeps that file")
    p.add_argument("-o", "--output", choices=["nfd", "json", "yaml"], default="nfd")
    p.set_defaults(run=run)


def _from_daemon(host) -> dict | None:
    """The daemon's labels; None when no daemon answers (a stale socket included)."""
    client = daemon_client(host)
    if client is None:
        return None
    from ..client import DaemonNotRunning
    try:
        with client:
            return client.labels()["labels"]
    except DaemonNotRunning:
        return None


def _refuse_write(host) -> None:
    from ..errors import ConflictError
    from ..labels import FEATURES_FILE
    if running_daemon_socket(host) is not None:
        raise ConflictError("the hostagent daemon keeps the features file and would undo this write",
                            where=str(host.host(FEATURES_FILE)),
                            hint="set the labels: section of the daemon's config file and reload it "
                                 "(systemctl reload hostagent), or stop the daemon first")


def _compute(host, mig_strategy: str, sharing, *, timestamp: bool, live_sharing: bool = False) -> dict:
    """``live_sharing``: the sharing labels follow the sharing hostagent has in force (as the
    daemon's do), when it shares devices, rather than ``sharing``."""
    from ..daemon.nodelabels import device_sharing
    from ..devices import read_inventory
    from ..labels import node_labels
    from ..labels.hostfacts import gpu_mode, machine_type
    from .common import note_unread
    inv = read_inventory(host)
    note_unread(inv)
    return node_labels(inv, mig_strategy=mig_strategy, sharing=sharing,
                       machine=machine_type(host), gpu_mode=gpu_mode(host, inv),
                       timestamp=int(time.time()) if timestamp else None,
                       device_sharing=device_sharing(host) if live_sharing else None)


def _mig_strategy(host, flag: str | None) -> str:
    """The flag, else as the daemon chooses (``nodelabels.mig_strategy``)."""
    from ..config import load_config
    from ..daemon.nodelabels import mig_strategy
    return mig_strategy(host, flag or load_config(host.config_file).section("labels")["mig_strategy"])


def run(args) -> int:
    from ..errors import UsageError
    from ..labels import FEATURES_FILE, TIMESTAMP, Sharing, render, write_labels
    from .output import emit
    sharing = Sharing(args.sharing_strategy or "none", 1 if args.replicas is None else args.replicas)
    if sharing.replicas < 1 or (sharing.strategy != "none" and sharing.replicas < 2):
        raise UsageError("--replicas must be at least 2 for a sharing strategy, 1 without")
    host = host_from_args(args)
    mig_strategy = _mig_strategy(host, args.mig_strategy)
    live = args.sharing_strategy is None and args.replicas is None
    if args.write:
        _refuse_write(host)
        labels = _compute(host, mig_strategy, sharing, timestamp=False, live_sharing=live)
        written, _ = write_labels(host, labels, timestamp=None if args.no_timestamp else int(time.time()))
        print(f"{host.host(FEATURES_FILE)}: {'written' if written else 'unchanged'}")
        return 0
    labels = None
    if not any(getattr(args, name) is not None for name in _COMPUTE):
        labels = _from_daemon(host)
    elif running_daemon_socket(host) is not None:
        print("hostagent: note: computed here with the options given; the daemon's labels follow "
              "its config (run without them to see those)", file=sys.stderr)
    if labels is None:
        labels = _compute(host, mig_strategy, sharing, timestamp=not args.no_timestamp, live_sharing=live)
    elif args.no_timestamp:
        labels.pop(TIMESTAMP, None)
    if args.output == "nfd":
        print(render(labels), end="")
    else:
        emit(labels, args.output, None)
    return 0
