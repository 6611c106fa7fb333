"""``hostagent health``: device health as the monitor sees it; watch in the foreground; clear.

``status`` and ``clear`` ask the daemon's API when it runs (``GET /v1/health``,
``POST /v1/health/clear``). Without a daemon they reach a ``health watch`` monitor through
the run directory: its published state file and clear-request files.
"""

from __future__ import annotations

import os
import sys

from .common import daemon_client, host_from_args
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

    v = verbs.add_parser("clear", help="mark devices healthy now (a GPU includes its MIG devices)",
                         description="Through the daemon's API when it runs (root only); else "
                                     "asks a 'hostagent health watch' monitor.")
    v.add_argument("devices", nargs="*", metavar="DEVICE", help="GPU index or UUID, MIG UUID or GPU:MIG")
    v.add_argument("--all", action="store_true", help="every device")
    v.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long to wait for a 'health watch' monitor to answer (default: 5)")
    v.set_defaults(run=clear)


def _from_daemon(host, call):
    """``call(client)`` on the daemon's API; None when no daemon answers on the socket."""
    client = daemon_client(host)
    if client is None:
        return None
    from ..client import DaemonNotRunning
    try:
        with client:
            return call(client)
    except DaemonNotRunning:          # a socket left by a daemon that is gone
        return None


def _footer(policy: str | None, quiet_period) -> str:
    return (f"\n{policy or ''}; quiet period: "
            f"{quiet_period or 'none (until cleared)'}{'s' if quiet_period else ''}")


def status(args) -> int:
    import datetime
    from ..health.statefile import read_state, state_from_dict
    from ..health.view import HEADERS, rows
    host = host_from_args(args)
    doc = _from_daemon(host, lambda c: c.health())
    if doc is not None:
        if not doc["enabled"]:
            print("hostagent: warning: health monitoring is disabled in the daemon (health.enabled: "
                  "false): every device is unmonitored", file=sys.stderr)
        if args.output != "table":
            emit(doc, args.output, None)
            return 0
        print(table(HEADERS, rows(state_from_dict(doc, doc["health_revision"]))))
        print(_footer(doc["policy"], doc["quiet_period"]))
        return 0
    published = read_state(host)
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
    print(_footer(published.doc.get("policy"), published.doc.get("quiet_period")))
    return 0


def _options(args, host):
    import dataclasses
    from ..config import load_config
    from ..health import HealthOptions
    options = HealthOptions.from_config(load_config(host.config_file).data.get("health"), os.environ)
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
    import dataclasses
    import json
    import logging
    import queue
    import signal
    import threading
    from ..devices import read_inventory
    from ..health import HealthMonitor
    host = host_from_args(args)
    options = _options(args, host)
    if options.state_file and not _can_publish(host):
        from .errors import rerun_as_root
        again = rerun_as_root(getattr(args, "command_line", sys.argv[1:]))
        print(f"hostagent: note: {host.run_dir}: permission denied: watching without publishing the state "
              f"'health status' and 'health clear' use; run it as root to publish: {again} "
              "(or pass --no-state-file)", file=sys.stderr)
        options = dataclasses.replace(options, state_file=False)
    if not args.verbose:       # this command prints every event itself
        logging.getLogger("hostagent.health").setLevel(logging.ERROR)
    inventory = read_inventory(host)
    _note_whole_gpu_events(inventory)
    monitor = HealthMonitor(host, inventory, options)
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


def _note_whole_gpu_events(inventory) -> None:
    """nvml.h (nvmlEventSetWait_v2): on a MIG-enabled GPU, a caller without the privilege
    to list its instances gets "only the events which affect all the instances"."""
    from .common import PRIVILEGE_HINT
    gpus = sorted({u.gpu for u in inventory.unread if u.what == "gpu instances"})
    if gpus:
        print(f"hostagent: warning: GPU {', '.join(map(str, gpus))}: NVML gives this user only the "
              "events of whole MIG-enabled GPUs; an error in a single MIG device is not seen "
              f"({PRIVILEGE_HINT} to see them)", file=sys.stderr, flush=True)


def _can_publish(host) -> bool:
    """Whether this process may write the state file in the run folder (made if missing)."""
    from ..fileio import ensure_dir
    try:
        ensure_dir(host.run_dir)
    except PermissionError:
        return False
    return os.access(host.run_dir, os.W_OK)


def clear(args) -> int:
    from ..errors import UsageError
    from ..health.clear_requests import answer_error, await_answer, submit_clear
    if args.all == bool(args.devices):
        raise UsageError("name the devices to clear, or pass --all (not both)")
    host = host_from_args(args)
    devices = None if args.all else args.devices
    answer = _from_daemon(host, lambda c: c.clear_health(devices))
    if answer is not None:
        cleared = answer["cleared"]
    else:                             # no daemon: a 'health watch' monitor, if any
        result = await_answer(submit_clear(host, devices), args.timeout)
        if not result["ok"]:
            raise answer_error(result)
        cleared = result["cleared"]
    print(f"cleared: {', '.join(cleared)}" if cleared else "nothing to clear: the devices were healthy")
    return 0
