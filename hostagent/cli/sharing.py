"""``hostagent sharing``: GPU sharing with MPS and time-slicing, from the device plugin's
sharing config file.

Through the daemon when it runs (it supervises the MPS daemons), directly under the node
lock when it does not (the daemon adopts what was started when it comes up).
"""

from __future__ import annotations

import os
import sys

from .common import host_from_args, say
from .errors import rerun_as_root
from .output import add_output_flag, emit, table

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("sharing", help="share GPUs with MPS or time-slicing (device plugin sharing config)",
                       description="Share GPUs and MIG devices with MPS control daemons or time-slicing, "
                                   "configured by the NVIDIA device plugin's sharing config file.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("status", help="what is shared, how, and the state of each MPS daemon")
    add_output_flag(v)
    v.set_defaults(run=run_status)

    v = verbs.add_parser("apply", help="apply a sharing config file (only what differs changes)",
                         description="Apply a sharing config: validate it against this node's devices, "
                                     "then start, reconfigure or stop MPS daemons and set compute modes and "
                                     "time-slices so that the node matches it. It is kept in "
                                     "/etc/hostagent/sharing.yaml and restored when the agent starts.")
    v.add_argument("-f", "--file", required=True, metavar="FILE", help="sharing config file (YAML or JSON; '-' for stdin)")
    v.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    add_output_flag(v)
    v.set_defaults(run=run_apply)

    v = verbs.add_parser("off", help="stop sharing: stop the MPS daemons, restore compute modes and time-slices")
    v.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    v.add_argument("--force", action="store_true",
                   help="also when allocations use shared devices (their containers lose MPS); removing the "
                        "package does this")
    add_output_flag(v)
    v.set_defaults(run=run_off)


def _client(host):
    """A client of the running daemon, or None (no daemon: act directly)."""
    from .common import running_daemon_socket
    path = running_daemon_socket(host)
    if path is None:
        return None
    from ..client import Client
    return Client(socket_path=path, timeout=120)


def render_status(data: dict) -> None:
    rows = []
    for d in data["devices"]:
        m = d.get("mps")
        daemon = "-" if m is None else (m["state"] + (f" (pid {m['pid']})" if m.get("pid") else ""))
        extra = d.get("interval") if d["strategy"] == "time-slicing" else (
            f"{d['active_thread_percentage']}% / {d['pinned_memory_limit_mib']} MiB")
        rows.append([d["name"], d["uuid"], d["strategy"], d["replicas"], d["resource"] + (
            f" -> {d['rename']}" if d.get("rename") else ""), extra, daemon])
    if not rows:
        print("no device is shared" + ("" if data.get("config") is None else " (the configuration selects none)"))
    else:
        print(table(["DEVICE", "UUID", "STRATEGY", "REPLICAS", "RESOURCE", "SETTINGS", "MPS DAEMON"], rows))
    for d in data["devices"]:
        m = d.get("mps") or {}
        if m.get("reason"):
            print(f"MPS daemon of device {d['name']}: {m['state']}: {m['reason']}"
                  + (f" (next try in {m['next_restart_in']:g} s)" if m.get("next_restart_in") is not None else ""))
    if data.get("waiting"):
        print(f"MPS daemons wait: {data['waiting']}")
    changed = [g for g in data["gpus"] if g.get("saved_compute_mode") or g.get("interval") != "Default"]
    if changed:
        print()
        print(table(["GPU", "UUID", "COMPUTE MODE", "BEFORE SHARING", "TIME-SLICE"],
                    [[g.get("index"), g["uuid"], g.get("compute_mode"), g.get("saved_compute_mode"), g.get("interval")]
                     for g in changed]))


def run_status(args) -> int:
    host = host_from_args(args)
    client = _client(host)
    if client is not None:
        with client:
            data = client.sharing()
    else:
        from ..sharing.journal import SharingJournal
        from ..sharing.service import status
        journal = SharingJournal.load(host)
        if journal is not None:
            say(f"note: {journal.describe()} was interrupted; the next 'hostagent sharing apply' or 'off' "
                "(or the agent's start) finishes or rolls it back")
        data = status(host)
    emit(data, args.output, render_status)
    return 0


def _results(report: dict) -> None:
    for r in report["results"]:
        print(("" if r["ok"] else "FAILED: ") + r["description"] + ("" if r["ok"] else f": {r['error']}"))
        for note in r.get("notes", []):
            print(f"hostagent: {note}", file=sys.stderr)


def print_outcome(out: dict, source: str | None = None, argv: list[str] | None = None) -> None:
    steps = out["plan"]["steps"]
    report = out.get("report")
    if out.get("recovered"):
        say(f"note: {out['recovered']}, as the configuration recorded says")
    for warning in out.get("warnings", []):
        say(f"warning: {source or 'the sharing configuration'}: {warning}")
    for problem in out.get("problems", []):
        say(f"warning: {problem}")
    if report is None:
        for s in steps:
            print(s["description"])
        if not steps:
            print("nothing to change")
        if steps and argv is not None and os.geteuid() != 0:
            # Compute modes and the daemons' shared memory are root's to change (nvml.h).
            say(f"note: the apply itself needs root: {rerun_as_root([a for a in argv if a != '--dry-run'])}")
        print("dry run: nothing was changed", file=sys.stderr)
        return
    _results(report)
    if out.get("rolled_back") is not None:
        print("rolled back to the configuration in force before (a step failed; nothing of this one is kept):")
        _results(out["rolled_back"])
    if argv is not None and os.geteuid() != 0 and any(r.get("denied") for r in report["results"]):
        say(f"error: steps were refused for want of privilege; run it as root: {rerun_as_root(argv)}")
    if not steps:
        print("already in place, nothing changed")


def _apply(args, config_doc) -> int:
    host = host_from_args(args)
    client = _client(host)
    if client is not None:
        with client:
            out = client.sharing_apply(config_doc, dry_run=args.dry_run, force=getattr(args, "force", False))
    else:
        from ..sharing.config import EMPTY, parse
        from ..sharing.service import apply
        config = EMPTY if config_doc is None else parse(config_doc, args.file)
        forced = getattr(args, "force", False)
        out = apply(host, config, dry_run=args.dry_run, allocations=[] if forced else _allocations(host),
                    on_lock_wait=_waiting).to_dict()
    emit(out, args.output, lambda o: print_outcome(o, "<stdin>" if args.file == "-" else args.file,
                                                   args.command_line))
    return 1 if out.get("report") and out["report"]["failed"] else 0


def _allocations(host) -> list:
    """The daemon's checkpointed allocations (read only): their devices keep their sharing."""
    from ..daemon import checkpoint
    from ..errors import StateError
    try:
        return checkpoint.read(host)
    except ValueError as e:
        raise StateError(f"the allocations checkpoint cannot be read ({e}), so the devices in use are unknown",
                         where=str(checkpoint.path(host)),
                         hint="start the daemon and apply through it (it keeps what it can read and holds what "
                              "the rest may hold until an admin dismisses it)") from None


def _waiting(holder: str) -> None:
    print(f"hostagent: waiting for the node lock, held by {holder}", file=sys.stderr, flush=True)


def run_apply(args) -> int:
    from ..sharing.config import load_file
    config = load_file(args.file)          # a bad file: one line, before anything else
    return _apply(args, config.document)


def run_off(args) -> int:
    args.file = None
    return _apply(args, None)
