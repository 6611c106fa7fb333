"""``hostagent mig``: apply, check and show MIG layouts from mig-parted config files.

Without ``-f`` the bundled default config (generated from the GPUs present) is used. As in
mig-parted, ``-f``, ``-c`` and ``-k`` default to $MIG_PARTED_CONFIG_FILE,
$MIG_PARTED_SELECTED_CONFIG and $MIG_PARTED_HOOKS_FILE.
"""

from __future__ import annotations

import os
import sys

from .common import host_from_args, say, seconds
from .migout import hooks_of, print_applied, progress, say_notes
from .output import FORMATS, add_output_flag, emit, table

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("mig", help="apply and inspect MIG layouts (mig-parted config files)",
                       description="Apply and inspect MIG layouts declared in mig-parted v1 config "
                                   "files, with explicit placements, minimal disruption and rollback.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("apply", help="apply a config (only what differs changes)",
                         description="Apply a MIG config: GPUs already matching are left alone; on "
                                     "the others only the instances that differ are destroyed and "
                                     "created. On any failure the previous layout is restored.")
    _config_flags(v)
    v.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    v.add_argument("-m", "--mode-only", action="store_true", help="only change the MIG mode")
    v.add_argument("-s", "--skip-reset", action="store_true",
                   help="leave Ampere mode changes pending (for a reboot) instead of resetting GPUs")
    v.add_argument("-k", "--hooks", "--hooks-file", dest="hooks", metavar="FILE",
                   default=os.environ.get("MIG_PARTED_HOOKS_FILE") or None,
                   help="mig-parted hooks file (default: $MIG_PARTED_HOOKS_FILE)")
    v.add_argument("--force", action="store_true",
                   help="terminate processes using instances that must be destroyed; without the "
                        "daemon, also take away devices its allocations checkpoint records")
    v.add_argument("--if-driver-loaded", action="store_true",
                   help="do nothing and exit 0 when the NVIDIA driver is not loaded (for the boot "
                        "unit: the daemon applies its layout once the driver is there)")
    v.add_argument("--lock-timeout", type=seconds, metavar="SECONDS",
                   help="give up if another apply holds the node lock this long "
                        "(default: wait for it to finish)")
    v.add_argument("-o", "--output", choices=FORMATS, default="table",
                   help="format of the --dry-run plan (default: table)")
    v.set_defaults(run=run_apply)

    v = verbs.add_parser("assert", help="exit 0 if the config is applied, 1 if not")
    _config_flags(v)
    v.add_argument("-m", "--mode-only", action="store_true", help="only check the MIG mode")
    v.add_argument("-a", "--valid-config", action="store_true",
                   default=_env_flag("MIG_PARTED_VALID_CONFIG"),
                   help="only check that the file is valid and has the selected config "
                        "(default: $MIG_PARTED_VALID_CONFIG)")
    v.set_defaults(run=run_assert)

    v = verbs.add_parser("plan", help="show what applying a config would change, per GPU")
    _config_flags(v)
    v.add_argument("-m", "--mode-only", action="store_true", help="only the MIG mode")
    add_output_flag(v)
    v.set_defaults(run=run_plan)

    v = verbs.add_parser("export", help="print the current layout as a v1 config")
    v.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                   help="output format (default: yaml)")
    v.add_argument("-l", "--config-label", default="current", help="config name (default: current)")
    v.add_argument("--bundled", action="store_true",
                   help="print the bundled default config for this node's GPUs instead")
    v.set_defaults(run=run_export)

    v = verbs.add_parser("status", help="MIG mode and layout per GPU, and any apply in progress")
    add_output_flag(v)
    v.set_defaults(run=run_status)


def _env_flag(name: str) -> bool:
    """A boolean flag's variable, read as mig-parted's CLI reads it (Go's strconv.ParseBool)."""
    return os.environ.get(name, "") in ("1", "t", "T", "TRUE", "true", "True")


def _config_flags(v) -> None:
    v.add_argument("-f", "--config-file", metavar="FILE",
                   default=os.environ.get("MIG_PARTED_CONFIG_FILE") or None,
                   help="mig-parted v1 config file, '-' for stdin (default: $MIG_PARTED_CONFIG_FILE, "
                        "else the bundled default)")
    v.add_argument("-c", "--selected-config", metavar="NAME",
                   default=os.environ.get("MIG_PARTED_SELECTED_CONFIG") or None,
                   help="config to use (default: $MIG_PARTED_SELECTED_CONFIG, or the only one)")


def _waiting(holder: str) -> None:
    say(f"waiting for the node lock, held by {holder}")


def _spec(args):
    from ..mig.spec import load_spec
    return load_spec(args.config_file) if args.config_file else None


def render_plan(plan) -> str:
    out = []
    for g in plan.gpus:
        head = f"GPU {g.index} ({g.name}, {g.pci_bus_id})"
        if not g.changed:
            out.append(f"{head}: unchanged ({g.before.describe()})")
            continue
        after = ("MIG enabled; the layout is planned then (this driver lists MIG profiles only "
                 "while MIG is enabled)") if g.deferred else g.after.describe()
        out += [f"{head}: {g.summary()}", f"  before: {g.before.describe()}", f"  after:  {after}"]
        out += [f"  - {s.describe()}" for s in g.steps]
        if g.reset:
            out.append(f"  - reset the GPU if the driver leaves the new mode pending (nvidia-smi -r -i {g.pci_bus_id})")
    if not plan.gpus:
        out.append(f"config '{plan.config}' selects no GPU on this node")
    out += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(out)


def refresh_cdi(host) -> None:
    """After a layout change: the node's CDI spec describes the new MIG devices. A spec
    problem is reported, never a reason to undo the layout."""
    from ..cdi.refresh import configured_options, refresh
    from ..errors import HostagentError
    try:
        change, generated = refresh(host, configured_options(host))
    except HostagentError as e:
        say(f"warning: the CDI spec was not refreshed: {e.message}")
        return
    progress(None, f"CDI spec: {change.describe()}")
    for problem in generated.problems:
        say(f"warning: {problem.message}")


def run_apply(args) -> int:
    from .migd import apply_through_daemon, checkpoint_guard
    through_daemon = apply_through_daemon(args)     # one writer: the daemon, when it runs
    if through_daemon is not None:
        return through_daemon
    import signal
    from ..mig import service
    # systemd stops a unit that exceeds its start timeout with SIGTERM: treat it as an
    # interrupt so the executor rolls back before exiting instead of dying half-way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    host = host_from_args(args)
    spec = _spec(args)
    hooks, env = hooks_of(args)
    from ..errors import DriverNotLoaded, NvmlLibraryMissing
    from ..sharing.service import mig_guard, resume
    try:
        result = service.apply(host, spec, args.selected_config, mode_only=args.mode_only,
                               skip_reset=args.skip_reset, force=args.force, dry_run=args.dry_run,
                               hooks=hooks, hook_env=env, progress=progress,
                               on_layout_changed=refresh_cdi, lock_timeout=args.lock_timeout,
                               on_lock_wait=_waiting,
                               refuse=mig_guard(host, checkpoint_guard(host, args.force), args.dry_run, progress))
    except (DriverNotLoaded, NvmlLibraryMissing) as e:
        if not args.if_driver_loaded:
            raise
        # A boot must not fail for it: the driver may be loaded later, from a container.
        say(f"MIG layout not applied: {e.what} (--if-driver-loaded)")
        return 0
    if args.dry_run:
        say_notes(result.notes)
        emit(result.plan.to_dict(), args.output, lambda _: print(render_plan(result.plan)))
        if result.plan.changed and os.geteuid() != 0:         # NVML changes MIG for root only (nvml.h)
            from .errors import rerun_as_root
            say("note: the apply itself needs root: "
                + rerun_as_root([a for a in args.command_line if a != "--dry-run"]))
        print("dry run: nothing was changed", file=sys.stderr)
        return 0
    resume(host, progress)
    print_applied(result.to_dict())
    return 0


def run_assert(args) -> int:
    from ..mig import service
    if args.valid_config:
        spec = _spec(args)
        if spec is None:
            from ..devices import read_inventory
            from ..mig.defaults import default_spec
            spec = default_spec(read_inventory(host_from_args(args)))
        name, _ = spec.select(args.selected_config)
        print(f"MIG configuration '{name}' is valid")
        return 0
    plan, notes = service.plan(host_from_args(args), _spec(args), args.selected_config,
                               mode_only=args.mode_only, on_layout_changed=refresh_cdi)
    say_notes(notes)
    service.require_applied(plan)
    print(f"MIG configuration '{plan.config}' is applied")
    return 0


def run_plan(args) -> int:
    from ..mig import service
    plan, notes = service.plan(host_from_args(args), _spec(args), args.selected_config,
                               mode_only=args.mode_only, on_layout_changed=refresh_cdi)
    say_notes(notes)
    emit(plan.to_dict(), args.output, lambda _: print(render_plan(plan)))
    return 0


def run_export(args) -> int:
    from ..devices import read_inventory
    from ..mig import service
    from ..mig.defaults import default_spec
    from ..mig.export import export_spec
    host = host_from_args(args)
    note = service.recover_pending(host, on_layout_changed=refresh_cdi)
    if note:
        say_notes([note])
    inventory = read_inventory(host)
    spec = default_spec(inventory) if args.bundled else export_spec(inventory, args.config_label)
    emit(spec.to_dict(), args.output, None)
    return 0


def run_status(args) -> int:
    from ..mig import service
    data = service.status(host_from_args(args), on_layout_changed=refresh_cdi)
    say_notes(data["notes"])

    def render(d):
        rows = []
        for g in d["gpus"]:
            mig = g["mig"]
            if mig is None:
                rows.append([g["index"], g["product"], "n/a", "-", "-"])
                continue
            mode = mig["mode"]["current"]
            if mig["mode"]["pending"] != mode:
                mode += f" (pending {mig['mode']['pending']})"
            devices = ", ".join(f"{n}x {p}" for p, n in sorted(mig["devices"].items())) or "-"
            placements = ", ".join(f"{gi['profile']}@{gi['placement']['start']}:{gi['placement']['size']}"
                                   for gi in mig["gpu_instances"]) or "-"
            rows.append([g["index"], g["product"], mode, devices, placements])
        print(table(["GPU", "PRODUCT", "MIG", "DEVICES", "GPU INSTANCES"], rows))
        if d["apply_in_progress"]:
            a = d["apply_in_progress"]
            print(f"\napply of '{a['config']}' in progress ({a['status']}, pid {a['pid']}, since {a['started']})")
        if d["checkpoint"]:
            c = d["checkpoint"]
            print(f"\nlast checkpoint: {c['created']} (before applying '{c['config']}')")

    emit(data, args.output, render)
    return 0
