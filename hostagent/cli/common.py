"""Helpers shared by the command modules."""

from __future__ import annotations

import os

__all__ = ["cluster_arguments", "node_name", "host_from_args", "daemon_socket", "running_daemon_socket", "daemon_client",
           "unread_lines", "note_unread", "say"]

DEFAULT_SOCKET = "/run/hostagent/hostagent.sock"


def say(line: str) -> None:
    """A line for the operator on stderr (progress, notes, warnings), apart from the
    command's output on stdout."""
    import sys
    print(f"hostagent: {line}", file=sys.stderr, flush=True)


def host_from_args(args, *, node: bool = True):
    """The host the global options name; a simulated node is run by the simulator's platform
    that ``main`` puts in ``args.simulator``. It must be a node already unless the command
    only reads or writes files the user names in it (``node`` false: CDI specs, engine
    configuration): nothing else is written into a folder that is not a node, which ``sim
    create`` would then refuse."""
    from ..hostroot import HostRoot
    host = HostRoot.from_env(getattr(args, "simulate", None), getattr(args, "host_root", None),
                             getattr(args, "driver_root", None), simulator=getattr(args, "simulator", None))
    if node:
        host.platform.require_node(host)
    return host


def daemon_socket(host):
    """The path of this node's daemon socket if one exists (it may still be stale: callers
    handle DaemonNotRunning). Cheap when no daemon runs: one stat, plus the cached config
    only when the node has a config file that may name another socket."""
    default = host.host(DEFAULT_SOCKET)
    if os.path.exists(default):
        return default
    if not os.path.exists(host.config_file):
        return None
    from ..config import load_config_cached
    try:
        path = host.host(load_config_cached(host.config_file, host.run_dir).section("api")["socket"])
    except Exception:          # an unreadable config: the daemon would not start with it either
        return None
    return path if path != default and os.path.exists(path) else None


def running_daemon_socket(host):
    """The socket of this node's daemon, if one accepts connections (without a socket
    file, one stat and no client import)."""
    path = daemon_socket(host)
    if path is None:
        return None
    from ..client import daemon_running
    return path if daemon_running(path) else None


def daemon_client(host, timeout: float = 10.0):
    """A client of this node's daemon, or None without a socket (the client module is then
    not even imported)."""
    path = daemon_socket(host)
    if path is None:
        return None
    from ..client import Client
    return Client(socket_path=path, timeout=timeout)


# What an unprivileged caller lacks: NVML's MIG listings and a MIG parent's aggregates.
PRIVILEGE_HINT = "run as root, or with read access to the mig/monitor capability (/dev/nvidia-caps/nvidia-cap2)"


def unread_lines(inv) -> list[str]:
    """One line per GPU whose facts NVML refused this process (``Inventory.unread``)."""
    by_gpu: dict[int, list[str]] = {}
    for u in inv.unread:
        by_gpu.setdefault(u.gpu, []).append(u.what)
    return [f"GPU {gpu}: NVML refused this user its {', '.join(whats)}; shown without them"
            for gpu, whats in sorted(by_gpu.items())]


def note_unread(inv) -> None:
    """Say on stderr what the inventory lacks for want of privilege, and how to get it."""
    lines = unread_lines(inv)
    for line in lines:
        say(f"note: {line}")
    if lines:
        say(f"note: to read them, {PRIVILEGE_HINT}")


def seconds(text: str, *, above_zero: bool = False) -> float:
    """An argparse type: a finite number of seconds, 0 or more (more than 0 when
    ``above_zero``)."""
    import argparse
    import math
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    if value < 0 or (above_zero and value == 0):
        raise argparse.ArgumentTypeError("must be more than 0" if above_zero else "must not be negative")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, more than 0."""
    return seconds(text, above_zero=True)


def cluster_arguments(p) -> None:
    """``--kubeconfig`` and ``--node-name``: how a command that talks to the Kubernetes API finds
    it and its own Node (the DRA plugin, the node controller)."""
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="the Kubernetes API's configuration (default: $KUBECONFIG, else the pod's service account)")
    p.add_argument("--node-name", metavar="NAME", help="this node's name in Kubernetes (default: $NODE_NAME)")


def node_name(args, environ) -> str:
    """The node's name: ``--node-name``, else ``$NODE_NAME``."""
    from ..errors import UsageError
    node = args.node_name or environ.get("NODE_NAME")
    if not node:
        raise UsageError("no node name", hint="give --node-name NAME or set NODE_NAME; in a pod, from the "
                                              "downward API's spec.nodeName")
    return node
