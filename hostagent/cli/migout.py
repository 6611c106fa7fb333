"""What ``hostagent mig apply`` prints and the hooks file it is given, whether it applies
itself or through the daemon (``migd``)."""

from __future__ import annotations

import sys

from .common import say

__all__ = ["hooks_of", "progress", "say_notes", "print_applied"]


def hooks_of(args):
    """The hooks file (None without one) and the variables mig-parted gives hooks."""
    if not args.hooks:
        return None, {}
    from ..mig.hooks import flag_env, load_hooks
    return load_hooks(args.hooks), flag_env(config_file=args.config_file, hooks_file=args.hooks,
                                            skip_reset=args.skip_reset, mode_only=args.mode_only)


def progress(gpu, message) -> None:
    print(f"GPU {gpu}: {message}" if gpu is not None else message, file=sys.stderr, flush=True)


def say_notes(notes) -> None:
    for note in notes:
        say(note)


def print_applied(out: dict) -> None:
    """An apply's outcome, done here or by the daemon (``ApplyResult.to_dict``): notes and
    warnings on stderr, a line per GPU and the summary on stdout."""
    say_notes(out["notes"])
    plan = out["plan"]
    for w in plan["warnings"]:
        say(f"warning: {w}")
    for g in plan["gpus"]:
        print(f"GPU {g['index']} ({g['product']}): {g['summary']}")
    if out["terminated"]:
        print(f"terminated (--force): {', '.join(out['terminated'])}")
    nodes = out["capability_nodes"]
    if nodes["created"] or nodes["removed"]:
        print(f"capability nodes: {len(nodes['created'])} created, {len(nodes['removed'])} removed")
    changed, total = len(out["changed"]), len(plan["gpus"])
    done = (f"{changed} GPU(s) changed, {total - changed} unchanged" if changed
            else "already in place, nothing changed")
    print(f"MIG configuration '{plan['config']}' applied successfully: {done}")
