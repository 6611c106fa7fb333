"""``hostagent driver``: verify the NVIDIA driver (and say exactly what is wrong), create its
device nodes, plan, install and roll back driver versions."""

from __future__ import annotations

from .common import host_from_args, say
from .output import add_output_flag, emit

__all__ = ["register", "render_verdict"]


def register(sub) -> None:
    p = sub.add_parser("driver", help="verify, install or roll back the NVIDIA driver",
                       description="Verify the NVIDIA driver, create its device nodes, and plan, "
                                   "install or roll back driver versions.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("verify", help="run every driver check; exit 0 when the driver is usable",
                         description="Run every driver check and print one row per check: its result "
                                     "(ok, warn, fail, skipped), the evidence and the fix. Exit 0 when "
                                     "the driver is usable, 1 when not.")
    add_output_flag(v)
    v.add_argument("--ignore", action="append", default=[], metavar="CHECK",
                   help="a check whose failure does not make the driver unusable (repeatable)")
    v.set_defaults(run=verify)

    v = verbs.add_parser("plan", help="the packages and steps 'driver install' would run",
                         description="Print the packages and every step installing driver VERSION takes "
                                     "on this host (nothing changes).")
    _install_options(v)
    add_output_flag(v)
    v.set_defaults(run=plan)

    v = verbs.add_parser("install", help="install (or change to) a driver version, verify it, roll back "
                                         "if it does not verify",
                         description="Install driver VERSION with the distribution's package manager: hold "
                                     "the agent's GPU work, stop the driver's daemons, unload the modules, "
                                     "install and hold the packages, load, verify, and roll back to the "
                                     "previous packages if the driver does not verify. Every step is "
                                     "journaled: an interrupted run is resumed by the next one.")
    _install_options(v)
    _run_options(v)
    v.add_argument("--report", metavar="FILE",
                   help="keep the run's state in FILE as it goes (JSON, written atomically): its process and "
                        "step while it runs, its outcome at the end, a refusal included (the agent starts "
                        "installs this way: POST /v1/driver/install)")
    v.set_defaults(run=install)

    v = verbs.add_parser("rollback", help="go back to the driver the last install replaced",
                         description="Reinstall the packages the last 'driver install' replaced (or, after "
                                     "an interrupted install, the ones it started from), then verify.")
    _run_options(v)
    v.set_defaults(run=rollback)

    v = verbs.add_parser("create-nodes", help="create the driver's missing device nodes",
                         description="Create /dev/nvidiactl, /dev/nvidia<minor>, /dev/nvidia-uvm(-tools) and, "
                                     "with MIG on, the capability nodes, where they are missing (as "
                                     "nvidia-modprobe does), with the majors /proc/devices lists.")
    v.add_argument("--dry-run", action="store_true", help="say which would be made")
    v.set_defaults(run=create_nodes)


def _install_options(v) -> None:
    v.add_argument("--version", required=True, help="the driver version, e.g. 550.90.07")
    v.add_argument("--flavour", choices=["auto", "open", "proprietary"], default="auto",
                   help="kernel module flavour (default: what the GPUs need, else NVIDIA's default for "
                        "the branch: open from R560)")


def _run_options(v) -> None:
    v.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    v.add_argument("--force", action="store_true",
                   help="go on although allocations or processes still use GPUs")
    v.add_argument("--ignore", action="append", default=[], metavar="CHECK",
                   help="a check whose failure does not fail the verification (repeatable)")
    add_output_flag(v)


def render_verdict(data: dict) -> str:
    """One row per check (name, result, summary), its evidence and fix on the lines below it."""
    width = max(len(c["name"]) for c in data["checks"]) + 2
    pad = " " * (width + 9)
    lines = [f"{'CHECK':<{width}}RESULT   SUMMARY"]
    for c in data["checks"]:
        lines.append(f"{c['name']:<{width}}{c['result']:<9}{c['summary']}")
        lines += [f"{pad}evidence: {e}" for e in c["evidence"]]
        if c["fix"]:
            lines.append(f"{pad}fix: {c['fix']}")
    lines.append("")
    if data["usable"]:
        lines.append(f"driver usable: {data['driver_version']}, CUDA {data['cuda_version'] or '?'}")
    else:
        lines.append(f"driver NOT usable: {len(data['failed'])} check(s) failed ({', '.join(data['failed'])})")
    return "\n".join(lines)


def verify(args) -> int:
    from ..driver.verify import verify as run_checks
    _check_ignored(args.ignore)
    host = host_from_args(args)
    _note_interrupted(host)
    verdict = run_checks(host, tuple(args.ignore))
    data = verdict.to_dict()
    emit(data, args.output, lambda d: print(render_verdict(d)))
    return 0 if verdict.usable else 1


def render_plan(d: dict) -> str:
    arrow = f"{d['previous'] or 'none'} -> {d['version']}"
    lines = [f"driver {d['operation']} on {d['distro']} with {d['manager']}: {arrow} "
             f"({d['flavour']} kernel modules)",
             "packages: " + " ".join(f"{n}={v}" for n, v in d["packages"])]
    if d["hold"]:
        lines.append("held afterwards: " + " ".join(d["hold"]))
    lines.append("steps:")
    for i, step in enumerate(d["steps"], 1):
        lines.append(f"  {i:2}. {step['name']}: {step['title']}")
        lines += [f"        $ {' '.join(c)}" for c in step["commands"]]
    if d["users"]:
        lines.append("still using GPUs (refused without --force):")
        lines += [f"  - {u}" for u in d["users"]]
    if d["notes"]:
        lines.append("notes:")
        lines += [f"  - {n}" for n in d["notes"]]
    return "\n".join(lines)


def _agent(args):
    from .common import running_daemon_socket
    host = host_from_args(args)
    socket = running_daemon_socket(host)
    if socket is None:
        return host, None
    from ..client import Client
    return host, Client(socket_path=socket, timeout=60)


def _note_interrupted(host) -> None:
    from ..driver.journal import Journal
    journal = Journal.load(host)
    if journal is not None and not journal.alive:
        say(f"note: {journal.describe()} was interrupted: 'hostagent driver install --version "
            f"{journal.plan.version}' finishes it, 'hostagent driver rollback' rolls it back")


def _print_plan(plan, args) -> int:
    emit(plan.to_dict(), args.output, lambda d: print(render_plan(d)))
    return 0


def plan(args) -> int:
    from ..driver.operations import make_plan
    host, agent = _agent(args)
    _note_interrupted(host)
    return _print_plan(make_plan(host, args.version, flavour=args.flavour, agent=agent), args)


def _outcome(result, args) -> int:
    data = result.to_dict()

    def render(d):
        if d["ok"] and not d["rolled_back"]:
            print(f"driver {d['version']} {'installed' if d['operation'] == 'install' else 'restored'} and verified")
        elif d["rolled_back"]:
            back = (d["verdict"] or {}).get("driver_version") or "the previous version"
            print(f"driver {d['version']} did not work ({d['error']}); rolled back to {back}, which verifies")
        else:
            print(f"driver {d['operation']} of {d['version']} stopped before changing packages: {d['error']}")
    emit(data, args.output, render)
    return 0 if data["ok"] and not data["rolled_back"] else 1


def install(args) -> int:
    from ..driver import operations
    if args.report and not args.dry_run:
        return _install_reported(args)
    host, agent = _agent(args)
    if args.dry_run:
        _note_interrupted(host)
        return _print_plan(operations.make_plan(host, args.version, flavour=args.flavour, agent=agent), args)
    _check_ignored(args.ignore)
    return _outcome(operations.install(host, args.version, flavour=args.flavour, force=args.force,
                                       ignore=args.ignore, agent=agent, progress=say), args)


def _install_reported(args) -> int:
    """``install --report FILE``: the same, its state kept in FILE from the first moment
    (a refusal is an outcome too)."""
    from ..driver import operations
    from ..driver.report import Report
    from ..errors import HostagentError
    report = Report(args.report, args.version)
    report.begin()

    def progress(line: str) -> None:
        say(line)
        report.progress(line)
    try:
        host, agent = _agent(args)
        _check_ignored(args.ignore)
        result = operations.install(host, args.version, flavour=args.flavour, force=args.force,
                                    ignore=args.ignore, agent=agent, progress=progress)
    except HostagentError as e:
        report.failed(e.message)
        raise
    report.end(result.to_dict())
    return _outcome(result, args)


def rollback(args) -> int:
    from ..driver import operations
    host, agent = _agent(args)
    _check_ignored(args.ignore)
    result = operations.rollback(host, force=args.force, ignore=args.ignore, agent=agent,
                                 dry_run=args.dry_run, progress=say)
    return _print_plan(result, args) if args.dry_run else _outcome(result, args)


def _check_ignored(names) -> None:
    from ..driver.checks import CHECK_NAMES
    from ..errors import UsageError
    unknown = sorted(set(names) - set(CHECK_NAMES))
    if unknown:
        raise UsageError(f"no check named {', '.join(unknown)}", hint=f"checks: {', '.join(CHECK_NAMES)}")


def create_nodes(args) -> int:
    from ..driver.nodes import create_missing
    made = create_missing(host_from_args(args), dry_run=args.dry_run)
    verb = "would create" if args.dry_run else "created"
    print("\n".join(f"{verb} {p}" for p in made) if made else "every device node is there")
    return 0
