"""``hostagent driver``: verify the NVIDIA driver (and say exactly what is wrong), create its
device nodes, plan, install and roll back driver versions."""

from __future__ import annotations

from .common import host_from_args
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
    from ..driver.checks import CHECK_NAMES
    from ..driver.verify import verify as run_checks
    from ..errors import UsageError
    unknown = sorted(set(args.ignore) - set(CHECK_NAMES))
    if unknown:
        raise UsageError(f"no check named {', '.join(unknown)}", hint=f"checks: {', '.join(CHECK_NAMES)}")
    verdict = run_checks(host_from_args(args), tuple(args.ignore))
    data = verdict.to_dict()
    emit(data, args.output, lambda d: print(render_verdict(d)))
    return 0 if verdict.usable else 1
