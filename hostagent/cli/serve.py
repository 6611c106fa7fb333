"""``hostagent serve``: run the agent daemon in the foreground (as ``hostagentd`` does)."""

from __future__ import annotations

from .common import host_from_args

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the agent daemon and its local API",
                       description="Run the agent daemon in the foreground: reconcile the node, then "
                                   "serve the API on /run/hostagent/hostagent.sock until SIGTERM.")
    from ..daemon.args import add_arguments
    add_arguments(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..daemon.main import missing_config, run as run_daemon, start_failure
    from ..errors import StateError, UsageError
    if missing_config(args.config):
        raise UsageError(missing_config(args.config))
    host = host_from_args(args)
    try:
        return run_daemon(host, args.config, args.log_level)
    except OSError as e:                  # its run folder, socket or state
        raise StateError(start_failure(e)) from None
