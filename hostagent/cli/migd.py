"""``hostagent mig apply`` through the daemon when it runs (one writer of node state):
the same request the API takes, the same summary printed. Without a daemon the MIG
command acts directly under the node lock. Dry runs change nothing and stay local.
"""

from __future__ import annotations

import sys

from .common import host_from_args, running_daemon_socket

__all__ = ["apply_through_daemon", "checkpoint_guard"]


def checkpoint_guard(host, force: bool):
    """For an apply acting directly (no daemon): refuse, as the daemon does, to take away
    devices its allocations checkpoint records; with --force, go on and say what the
    daemon will drop at its next start. The checkpoint is only read."""
    def refuse(inventory, plan) -> None:
        if not plan.changed:
            return                   # a no-op apply (every boot, usually) reads nothing more
        from ..daemon import checkpoint
        from ..daemon.migops import refuse_allocated
        from ..errors import ConflictError, StateError
        where = str(checkpoint.path(host))
        try:
            allocations = checkpoint.read(host)
        except ValueError as e:
            if force:
                print(f"hostagent: warning: {where} cannot be read ({e}); applying anyway (--force)",
                      file=sys.stderr)
                return
            raise StateError(f"the allocations checkpoint cannot be read ({e}), so the devices it "
                             "protects are unknown", where=where,
                             hint="start the daemon and apply through it (it keeps what it can read and holds "
                                  "what the rest may hold until an admin dismisses it), or "
                                  "pass --force") from None
        try:
            refuse_allocated(inventory, plan, allocations,
                             hint=f"release their allocations first (recorded in {where}), or pass --force")
        except ConflictError as e:
            if not force:
                raise
            print(f"hostagent: warning: {e.what} (--force); the daemon drops allocations "
                  f"{', '.join(e.details['allocations'])} at its next start", file=sys.stderr)
    return refuse


def _document(path: str | None, what: str):
    if not path:
        return None
    from ..fileio import read_config_file
    from ..mig.spec import decode_document
    # Keys stay strings: a config named "off" is not False.
    return decode_document(read_config_file(path, what), "<stdin>" if path == "-" else path)


def apply_through_daemon(args) -> int | None:
    """The exit code, or None when there is no daemon (or for a dry run): act directly.

    The daemon does the NVML work; hooks run here, in the caller's context (the daemon's
    sandbox would stop hooks that edit /etc or use /tmp), at mig-parted's points as far as
    two requests allow: ``apply-start``, then ``pre-apply-mode`` and ``pre-apply-config``
    if the daemon's plan changes modes or instances, then the apply, then ``apply-exit``,
    always. The daemon refreshes the CDI spec before it answers, so ``apply-exit`` sees the
    new devices.
    """
    if args.dry_run:
        return None
    host = host_from_args(args)
    socket_path = running_daemon_socket(host)
    if socket_path is None:
        return None
    from ..client import Client
    from .migout import hooks_of, print_applied, progress
    layout = {"config": args.selected_config or None,
              "spec": _document(args.config_file, "MIG config file")}
    flags = {"mode_only": args.mode_only, "skip_reset": args.skip_reset, "force": args.force}
    hooks, env = hooks_of(args)      # a bad hooks file fails here, before anything runs
    print(f"hostagent: applying through the daemon ({socket_path})", file=sys.stderr)
    # No timeout: an apply with GPU resets takes minutes.
    with Client(socket_path=socket_path, timeout=None) as client:
        if hooks is None:
            result = client.mig_apply(**layout, **flags)
        else:
            result = _apply_with_hooks(client, layout, flags, hooks, env)
    for p in result.get("progress", []):
        progress(p["gpu"], p["message"])
    print_applied(result)
    return 0


def _apply_with_hooks(client, layout: dict, flags: dict, hooks, env: dict) -> dict:
    from ..mig.hooks import around_apply
    planned = client.mig_plan(**layout, mode_only=flags["mode_only"])["plan"]
    env = {**env, "MIG_PARTED_SELECTED_CONFIG": planned["config"]}
    with around_apply(hooks, env):
        # Both before the daemon's apply: a failing pre-apply-config then leaves the node
        # untouched (mig-parted runs it between the phases, after the mode changes).
        if planned["mode_changes"]:
            hooks.run("pre-apply-mode", env)
        if planned["config_changes"]:
            hooks.run("pre-apply-config", env)
        return client.mig_apply(**layout, **flags)
