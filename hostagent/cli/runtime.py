"""``hostagent runtime``: configure container engines, revert, install the shim."""

from __future__ import annotations

import sys

from .common import host_from_args

__all__ = ["register"]

ENGINE_NAMES = ("containerd", "crio", "docker")


def register(sub) -> None:
    p = sub.add_parser("runtime", help="container runtime configuration and the runtime shim")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("configure", help="add hostagent's runtime to containerd, CRI-O or Docker")
    v.add_argument("--runtime", choices=ENGINE_NAMES, required=True)
    v.add_argument("--config", metavar="FILE", help="the engine's main config file (default: the engine's)")
    group = v.add_mutually_exclusive_group()
    group.add_argument("--drop-in", metavar="FILE",
                       help="write the runtime here (containerd and CRI-O; default: conf.d/99-hostagent.toml, "
                            "crio.conf.d/99-hostagent.toml in the main file's folder)")
    group.add_argument("--no-drop-in", action="store_true", help="edit the main file (containerd only)")
    v.add_argument("--cdi", action="store_true", help="also turn on the engine's own CDI support")
    v.add_argument("--set-as-default", action="store_true", help="make the runtime the engine's default")
    v.add_argument("--runtime-name", default="hostagent", help="name of the runtime entry (default: hostagent)")
    v.add_argument("--shim", metavar="PATH", help="the shim the entry runs (default: "
                                                  "/usr/local/sbin/hostagent-runtime, see install-shim)")
    _common(v)
    v.add_argument("--restart", action="store_true", help="restart the engine afterwards")
    v.set_defaults(run=configure)

    v = verbs.add_parser("revert", help="restore every file configure changed as it was before hostagent")
    v.add_argument("--runtime", choices=ENGINE_NAMES, required=True)
    v.add_argument("--force", action="store_true", help="restore even files changed since hostagent wrote them")
    _common(v)
    v.add_argument("--restart", action="store_true", help="restart the engine afterwards")
    v.set_defaults(run=revert)

    v = verbs.add_parser("install-shim", help="write the hostagent-runtime front that engines execute")
    v.add_argument("--path", help="where (default: /usr/local/sbin/hostagent-runtime)")
    v.add_argument("--low-level-runtime", metavar="PATH",
                   help="runc or crun to hand containers to (default: the first of runtime.low_level_runtimes)")
    v.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    v.add_argument("--agent-config", metavar="FILE",
                   help="the hostagent config the shim reads (default: /etc/hostagent/config.yaml)")
    v.add_argument("--cache-dir", metavar="DIR",
                   help="where the shim keeps its validated copy of that config (default: /run/hostagent)")
    v.set_defaults(run=install_shim)


def _common(v) -> None:
    v.add_argument("--dry-run", action="store_true", help="print a unified diff of every file, write nothing")
    v.add_argument("--backup-dir", metavar="DIR",
                   help="where previous files are kept (default: /var/lib/hostagent/runtime-backups)")
    v.add_argument("--agent-config", metavar="FILE",
                   help="hostagent's own config (default: /etc/hostagent/config.yaml)")


def _agent_config(host, args):
    from ..config import load_config
    return load_config(args.agent_config or host.config_file)


def _finish(host, plan, args, verb: str, removed_dirs=()) -> int:
    from ..runtime.files import diff
    if args.dry_run:
        sys.stdout.write(diff(plan.changes) or "no changes\n")
        for d in plan.created_dirs:
            print(f"would remove {d} if empty")
        return 0
    for c in plan.changes:
        print(f"{'removed' if c.new is None else 'wrote'} {c.snapshot.real}")
    for d in removed_dirs:
        print(f"removed {d}")
    if not plan.changes:
        print(f"{plan.runtime}: already {verb}; nothing to do")
        return 0
    if args.restart:
        from ..runtime.restart import CONTAINERD_SOCKET, restart
        print(restart(host, plan.runtime, plan.service, containerd_socket=plan.socket or CONTAINERD_SOCKET))
    else:
        print(f"restart {plan.runtime} to apply this (for example: systemctl restart {plan.service}, or rerun with --restart)")
    return 0


def configure(args) -> int:
    from ..lock import node_lock
    from ..runtime.configure import DEFAULT, apply_plan, backup_folder, plan_configure
    from ..runtime.engine import Settings
    from ..runtime.front import DEFAULT_SHIM_PATH
    host = host_from_args(args, node=False)      # engine files only
    config = _agent_config(host, args)
    settings = Settings(runtime_name=args.runtime_name, binary=args.shim or DEFAULT_SHIM_PATH,
                        set_as_default=args.set_as_default, cdi=args.cdi,
                        cdi_spec_dirs=config.runtime.cdi_spec_dirs)
    drop_in = None if args.no_drop_in else (args.drop_in or DEFAULT)
    notes = []
    if args.dry_run:
        plan = plan_configure(host, args.runtime, settings, config=args.config, drop_in=drop_in)
    else:
        with node_lock(host, f"runtime configure --runtime {args.runtime}"):
            plan = plan_configure(host, args.runtime, settings, config=args.config, drop_in=drop_in)
            notes = apply_plan(plan, backup_folder(host, args.runtime, args.backup_dir))
    for note in plan.notes + notes:
        print(f"hostagent: note: {note}", file=sys.stderr)
    if not host.host(settings.binary).exists():
        print(f"hostagent: warning: {settings.binary} does not exist yet; "
              f"run 'hostagent runtime install-shim --path {settings.binary}'", file=sys.stderr)
    return _finish(host, plan, args, "configured")


def revert(args) -> int:
    from ..lock import node_lock
    from ..runtime.configure import apply_revert, backup_folder, plan_revert
    host = host_from_args(args, node=False)
    folder = backup_folder(host, args.runtime, args.backup_dir)
    removed = []
    if args.dry_run:
        plan = plan_revert(host, args.runtime, folder, force=args.force)
    else:
        with node_lock(host, f"runtime revert --runtime {args.runtime}"):
            plan = plan_revert(host, args.runtime, folder, force=args.force)
            removed = apply_revert(plan, folder)
    return _finish(host, plan, args, "as before", removed)


def install_shim(args) -> int:
    from ..config import DEFAULT_PATH
    from ..fileio import write_atomic
    from ..runtime.configure import absolute_path
    from ..runtime.files import Change, diff, read_one
    from ..runtime.front import DEFAULT_SHIM_PATH, front_settings, render_front
    host = host_from_args(args, node=False)
    if host.mounted:
        from ..errors import UsageError
        raise UsageError("the runtime shim runs the host's own hostagent installation, which a container "
                         "(--host-root) cannot write for it",
                         hint="install hostagent on the host for the shim, or use the engine's own CDI "
                              "support: 'hostagent runtime configure --cdi'")
    config = _agent_config(host, args)
    path = args.path or DEFAULT_SHIM_PATH
    agent_config = args.agent_config or str(host.host(DEFAULT_PATH))
    cache_dir = absolute_path(args.cache_dir or str(host.run_dir), "--cache-dir",
                              hint="engines run the shim from a working directory of their own")
    current = read_one(host, path)
    if not current.real.parent.is_dir():       # the same answer with --dry-run
        from ..errors import NotFoundError
        raise NotFoundError(f"the directory for the shim ({path}) does not exist", where=str(current.real.parent),
                            hint=f"create it (mkdir -p {current.real.parent}), or give --path a folder "
                                 "that exists and the same path to 'runtime configure --shim'")
    text = render_front(front_settings(config.runtime, runtime=args.low_level_runtime,
                                       config=agent_config, cache_dir=cache_dir))
    if args.dry_run:
        sys.stdout.write(diff([Change(current, text)]) if current.text != text else "no changes\n")
        return 0
    if current.text == text:
        print(f"{current.real} is up to date")
        return 0
    try:
        write_atomic(current.real, text, mode=0o755)
    except OSError as e:
        from ..errors import HostagentError
        raise HostagentError(f"cannot write the shim: {e.strerror}", where=str(current.real),
                             hint="nothing was changed") from None
    print(f"wrote {current.real}")
    return 0
