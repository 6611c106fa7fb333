"""The agent's group by name and by id, as the host knows it: a mounted host's own
``/etc/group`` (the DaemonSet's container has groups of its own, whose ids mean other groups
on the host), else this system's."""

from __future__ import annotations

import grp
import os

from .hostroot import HOST_ROOT_ENV, HostRoot

__all__ = ["group_id", "group_name"]


def _host_groups(root: os.PathLike | str) -> list[list[str]]:
    try:
        with open(os.path.join(root, "etc/group"), encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n").split(":") for line in f]
    except OSError:
        return []


def _mounted_root(host: HostRoot | None) -> str | None:
    """The mounted host's root: ``host``'s, or HOSTAGENT_HOST_ROOT's for a client that has
    no ``HostRoot`` (a command in the agent's container)."""
    if host is not None:
        return str(host.root) if host.mounted else None
    return os.environ.get(HOST_ROOT_ENV) or None


def group_id(name: str, host: HostRoot | None = None) -> int | None:
    root = _mounted_root(host) if host is not None else None
    if root is None:
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            return None
    for fields in _host_groups(root):
        if len(fields) >= 3 and fields[0] == name and fields[2].isascii() and fields[2].isdigit():
            return int(fields[2])
    return None


def group_name(gid: int, host: HostRoot | None = None) -> str | None:
    root = _mounted_root(host)
    if root is None:
        try:
            return grp.getgrgid(gid).gr_name
        except KeyError:
            return None
    return next((f[0] for f in _host_groups(root) if len(f) >= 3 and f[2] == str(gid)), None)
