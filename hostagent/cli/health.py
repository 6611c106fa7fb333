"""``hostagent health``: device health as the monitor sees it; watch in the foreground; clear.

``status`` and ``clear`` talk to whichever process runs the monitor (the daemon, or
``health watch``) through the run directory: the published state file and clear requests.
"""

from __future__ import annotations

import sys

from .common import host_from_args
from .output import add_output_flag, emit, table

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("health", help="GPU health: status, watch, clear",
                       description="GPU health from NVML events (XIDs, double-bit ECC errors, lost "
                                   "GPUs), per GPU and MIG device.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("status", help="each device's health, as the running monitor publishes it")
    add_output_flag(v)
    v.set_defaults(run=status)

    v = verbs.add_parser("watch", help="run the health monitor in the foreground and print changes",
                         description="Run the monitor the daemon runs, in this process, printing "
                                     "every change (JSON: one object per line). Options override "
                                     "the config file's health section.")
    v.add_argument("-o", "--output", choices=["table", "json"], default="table")
    v.add_argument("--quiet-period", type=float, metavar="SECONDS",
                   help="healthy again after this long without a critical event (0: never)")
    v.add_argument("--disable-xids", metavar="LIST", help="XIDs to ignore besides the defaults, or 'all'")
    v.add_argument("--enable-xids", metavar="LIST", help="XIDs that count whatever else says, or 'all'")
    v.add_argument("--no-state-file", action="store_true",
                   help="do not publish state for 'health status' nor take 'health clear'")
    v.set_defaults(run=watch)

    v = verbs.add_parser("clear", help="mark devices healthy now (a GPU includes its MIG devices)")
    v.add_argument("devices", nargs="*", metavar="DEVICE", help="GPU index or UUID, MIG UUID or GPU:MIG")
    v.add_argument("--all", action="store_true", help="every device")
    v.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long to wait for the monitor to answer (default: 5)")
    v.set_defaults(run=clear)


def status(args) -> int:
    import datetime
    from ..health.statefile import read_state
    from ..health.view import HEADERS, rows
    published = read_state(host_from_args(args))
    stale = not published.writer_alive
    if stale:
        when = datetime.datetime.fromtimestamp(published.written_at).isoformat(timespec="seconds")
        print(f"hostagent: warning: the monitor that wrote this (pid {published.pid}) is not "
              f"running; state as of {when}", file=sys.stderr)
    if args.output != "table":
        doc = dict(published.doc, stale=stale)
        emit(doc, args.output, None)
        return 0
    print(table(HEADERS, rows(published.state)))
    print(f"\n{published.doc.get('policy', '')}; quiet period: "
          f"{published.doc.get('quiet_period') or 'none (until cleared)'}"
          f"{'s' if published.doc.get('quiet_period') else ''}")
    return 0


def _options(args, host):
    import dataclasses
    from ..config import load_config
    from ..health import HealthOptions
    options = HealthOptions.from_config(load_config(host.config_file).data.get("health"))
    changes = {}
    if args.quiet_period is not None:
        changes["quiet_period"] = args.quiet_period or None
    if args.disable_xids is not None:
        changes["disable_xids"] = (args.disable_xids,)
    if args.enable_xids is not None:
        changes["enable_xids"] = (args.enable_xids,)
    if args.no_state_file:
        changes["state_file"] = False
    options = dataclasses.replace(options, **changes)
    options.policy          # bad XID lists fail here, before anything starts
    return options


def _states(changes) -> str:
    by_state: dict[str, list[str]] = {}
    for d in changes:
        by_state.setdefault(d.state, []).append(d.name)
    return "; ".join(f"{state}: {', '.join(names)}" for state, names in by_state.items())


def _line(update) -> str:
    ev = update.event
    if ev is None:
        return f"[{update.revision}] {update.cause} -> {_states(update.changes)}"
    what = ev.kind + (f" {ev.xid}" if ev.xid is not None else "") + (" (ignored)" if ev.ignored else "")
    where = f"GPU {ev.gpu}" + (f" GI {ev.gi}" if ev.gi is not None else "") + (
        f" CI {ev.ci}" if ev.ci is not None else "")
    detail = f" ({ev.detail})" if ev.detail else ""
    changed = [d for d in update.changes if not (ev.ignored and d.healthy)]   # not every last-XID bump
    return f"[{update.revision}] {what} on {where}{detail} -> {_states(changed) or 'no change'}"


def watch(args) -> int:
    import json
    import logging
    import queue
    import signal
    import threading
    from ..devices import read_inventory
    from ..health import HealthMonitor
    host = host_from_args(args)
    options = _options(args, host)
    if not args.verbose:       # this command prints every event itself
        logging.getLogger("hostagent.health").setLevel(logging.ERROR)
    monitor = HealthMonitor(host, read_inventory(host), options)
    updates: queue.Queue = queue.Queue()
    monitor.subscribe(updates.put)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def out(text: str) -> None:
        print(text, flush=True)

    monitor.start()
    try:
        st = monitor.state
        if args.output == "json":
            out(json.dumps({"revision": st.revision, "cause": "initial", "event": None,
                            "changes": [d.to_dict() for d in st.devices.values()]}))
        else:
            print(f"watching {len(st.devices)} device(s); {options.policy.describe()}; "
                  "Ctrl-C to stop", file=sys.stderr, flush=True)
        while not stop.is_set():
            try:
                update = updates.get(timeout=0.2)
            except queue.Empty:
                continue
            out(json.dumps(update.to_dict()) if args.output == "json" else _line(update))
    finally:
        monitor.stop()
    return 0


def clear(args) -> int:
    from ..errors import UsageError
    from ..health.clear_requests import answer_error, await_answer, submit_clear
    if args.all == bool(args.devices):
        raise UsageError("name the devices to clear, or pass --all (not both)")
    host = host_from_args(args)
    result = await_answer(submit_clear(host, None if args.all else args.devices), args.timeout)
    if not result["ok"]:
        raise answer_error(result)
    cleared = result["cleared"]
    print(f"cleared: {', '.join(cleared)}" if cleared else "nothing to clear: the devices were healthy")
    return 0
