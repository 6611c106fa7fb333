"""``hostagent cdi``: generate, refresh, list and validate CDI specs."""

from __future__ import annotations

import sys

from .common import host_from_args
from .output import add_output_flag, emit, table

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("cdi", help="CDI specs for GPUs and MIG devices")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("generate", help="print (or write) a CDI spec for this node")
    v.add_argument("--output", metavar="FILE", help="write the spec here (atomically, mode 0644); "
                   "it must end in .json or .yaml, the only files CDI readers load")
    v.add_argument("--format", choices=["json", "yaml"], help="default: from --output's extension, else json")
    _spec_flags(v)
    v.set_defaults(run=generate)

    v = verbs.add_parser("refresh", help="regenerate the node's spec in /var/run/cdi if it changed")
    v.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    _spec_flags(v)
    v.set_defaults(run=refresh)

    v = verbs.add_parser("list", help="list the devices the spec directories offer")
    add_output_flag(v)
    v.set_defaults(run=list_devices)

    v = verbs.add_parser("validate", help="check spec files against CDI's rules")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.set_defaults(run=validate)


def _spec_flags(v) -> None:
    v.add_argument("--vendor", default="nvidia.com")
    v.add_argument("--class", dest="device_class", default="gpu")
    v.add_argument("--device-name-strategy", default="index,uuid",
                   help="comma list of index, uuid, type-index (default: index,uuid)")
    v.add_argument("--dev-root", metavar="DIR", help="where /dev is (default: the host root)")
    v.add_argument("--no-all-device", action="store_true", help="leave out the 'all' device")
    v.add_argument("--cdi-version", default="auto", help="auto (the lowest the content needs) or X.Y.Z")


def _host_and_options(args):
    import dataclasses
    from ..cdi.naming import parse_strategies
    from ..cdi.refresh import configured_options
    host = host_from_args(args)
    if args.dev_root:
        host = dataclasses.replace(host, dev_root=host.host(args.dev_root) if host.mounted else args.dev_root)
    options = configured_options(host, vendor=args.vendor, device_class=args.device_class,
                                 name_strategies=parse_strategies(args.device_name_strategy),
                                 all_device=not args.no_all_device, cdi_version=args.cdi_version)
    return host, options


def _report(problems) -> int:
    for p in problems:
        print(f"hostagent: error: {p.message}", file=sys.stderr)
    return 1 if problems else 0


def generate(args) -> int:
    from ..cdi.refresh import generate as gen
    from ..cdi.render import render
    from ..cdi.spec import NothingToDescribe
    if args.output:
        _check_output(args.output)
    fmt = _output_format(args.output, args.format)
    from ..devices import read_inventory
    from .common import note_unread
    host, options = _host_and_options(args)
    inventory = read_inventory(host)
    note_unread(inventory)
    try:
        generated = gen(host, options, inventory)
    except NothingToDescribe as e:
        _report(e.left_out)
        raise
    text = render(generated.spec, fmt)
    if args.output:
        _write(args.output, text)
    else:
        sys.stdout.write(text)
    return _report(generated.problems)


# CDI readers load only these; any other name is ignored by every engine.
SPEC_EXTENSIONS = {".json": "json", ".yaml": "yaml"}


def _output_format(output: str | None, fmt: str | None) -> str:
    """--format, else the one --output's extension says; a file engines would not read,
    or an extension that contradicts --format, is refused."""
    import os
    from ..errors import UsageError
    if not output:
        return fmt or "json"
    ext = os.path.splitext(output)[1]
    if ext not in SPEC_EXTENSIONS:
        raise UsageError(f"--output {output}: CDI readers load only files ending in .json or .yaml",
                         hint="name the file *.json or *.yaml, or leave --output out to print the spec")
    if fmt and fmt != SPEC_EXTENSIONS[ext]:
        raise UsageError(f"--output {output} ends in {ext} but --format is {fmt}",
                         hint=f"drop --format (the extension decides) or name the file *.{fmt}")
    return SPEC_EXTENSIONS[ext]


def _check_output(output: str) -> None:
    import os
    from ..errors import NotFoundError, UsageError
    if os.path.isdir(output):
        raise UsageError(f"--output {output} is a directory",
                         hint=f"give a file name in it, such as {os.path.join(output, 'nvidia.com-gpu.json')}")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise NotFoundError(f"the directory for --output {output} does not exist", where=parent,
                            hint="create it first, or write the spec elsewhere")


def _write(output: str, text: str) -> None:
    from ..errors import HostagentError
    from ..fileio import write_atomic
    try:
        write_atomic(output, text, mode=0o644)
    except OSError as e:
        raise HostagentError(f"cannot write the spec: {e.strerror or e}", where=output,
                             hint="check the directory exists and is writable") from None


def refresh(args) -> int:
    from ..cdi.refresh import refresh as do_refresh
    host, options = _host_and_options(args)
    change, generated = do_refresh(host, options, dry_run=args.dry_run)
    print(("dry run, nothing written: " if args.dry_run and change.written else "") + change.describe())
    return _report(generated.problems)


def list_devices(args) -> int:
    from ..cdi.registry import SPEC_DIRS, list_devices as do_list
    host = host_from_args(args, node=False)      # reads spec files only
    devices, errors = do_list(host)
    searched = [str(host.host(d)) for d in SPEC_DIRS]
    emit({"devices": devices, "errors": errors, "searched": searched}, args.output, lambda d: d["devices"] and print(
        table(["DEVICE", "SPEC"], [[x.name, x.spec] for x in d["devices"]])))
    for e in errors:
        print(f"hostagent: warning: {e}", file=sys.stderr)
    if not devices:
        print(f"hostagent: note: no CDI devices in {' or '.join(searched)} (searched in that order); "
              "'hostagent cdi refresh' writes this node's spec", file=sys.stderr)
    return 0


def validate(args) -> int:
    failed = 0
    for path in args.files:
        problems, warnings = _check_file(path)
        for p in problems:
            # A syntax error's line and column follow the path as compilers write them.
            print(f"{path}{'' if p.startswith(':') else ': '}{p}")
        if problems:
            failed += 1
        else:
            print(f"{path}: valid")
        for w in warnings:
            print(f"{path}: warning: {w}")
    return 1 if failed else 0


def _check_file(path: str) -> tuple[list[str], list[str]]:
    """(problems, warnings) of one spec file; whatever it holds, the next file is checked."""
    from ..cdi.validate import read_spec, spec_warnings, validate_spec
    from ..errors import HostagentError
    try:
        doc, problems = read_spec(path)
    except HostagentError as e:
        at = e.where[len(path):] if e.where and e.where.startswith(f"{path}:") else ""
        return [f"{at}: {e.what}" if at else e.what], []
    except Exception as e:                # noqa: BLE001 - one file never stops the others
        return [f"cannot be read as a CDI spec ({type(e).__name__}: {e})"], []
    # An unquoted scalar is said once, with its cause, not again as a bad value.
    typed = {p.split(":", 1)[0] for p in problems}
    try:
        problems += [p for p in validate_spec(doc) if p.split(":", 1)[0] not in typed]
    except Exception as e:                # noqa: BLE001
        problems.append(f"cannot be checked ({type(e).__name__}: {e})")
    return problems, (spec_warnings(doc) if not problems else [])
