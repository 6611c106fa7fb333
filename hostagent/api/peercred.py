"""Who is on the other end of a UNIX socket, and what they may do.

``SO_PEERCRED`` gives the uid, gid and pid the kernel recorded at ``connect()``; they cannot
be forged by the peer. Supplementary groups come from ``SO_PEERGROUPS`` (Linux 4.13+), also
recorded at connect time, with ``/proc/<pid>/status`` as the fallback on older kernels.

Roles, from most to least trusted:

    admin     uid 0, and the agent's own user: everything (a daemon that runs without
              root, on a simulated node, answers its user as root's would: that user may
              already stop it and change its files)
    operator  member of the agent's group: read, and manage allocations
    none      anyone else: refused (403) before any route is looked at
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

__all__ = ["Caller", "ROLES", "peer_caller", "role_for", "allows"]

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
ROLES = ("none", "operator", "admin")      # ordered: a role may do what those before it may


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]
    role: str = "none"

    def describe(self) -> str:
        return f"uid {self.uid} pid {self.pid} ({self.role})"


def role_for(uid: int, gid: int, groups: tuple[int, ...], agent_gid: int | None, agent_uid: int = 0) -> str:
    if uid in (0, agent_uid):
        return "admin"
    if agent_gid is not None and (gid == agent_gid or agent_gid in groups):
        return "operator"
    return "none"


def allows(role: str, needed: str) -> bool:
    return ROLES.index(role) >= ROLES.index(needed)


def _groups(sock: socket.socket, pid: int) -> tuple[int, ...]:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 1024)
        return struct.unpack(f"{len(raw) // 4}I", raw)
    except OSError:
        pass
    try:   # older kernels: racy (the pid may exit), but only ever grants less
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return tuple(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


def peer_caller(sock: socket.socket, agent_gid: int | None) -> Caller:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    groups = () if uid == 0 else _groups(sock, pid)
    return Caller(pid=pid, uid=uid, gid=gid, groups=groups,
                  role=role_for(uid, gid, groups, agent_gid, os.geteuid()))
