"""Making an engine read its new configuration.

Under systemd (``/run/systemd/system`` exists, as ``sd_booted`` checks): ``systemctl
restart <unit>``. Without systemd only containerd can be told, by signal, as the
toolkit's installer does: SIGHUP to the pid found through the socket's peer credentials.
containerd 1.6 has no configuration reload; SIGHUP ends it and its supervisor must start
it again, which reads the new configuration.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess

from ..errors import HostagentError, NotFoundError, StateError

__all__ = ["restart", "systemd_running", "socket_peer_pid", "CONTAINERD_SOCKET"]

CONTAINERD_SOCKET = "/run/containerd/containerd.sock"


def systemd_running(host) -> bool:
    return host.host("/run/systemd/system").is_dir()


def socket_peer_pid(path) -> int:
    """The pid of the process listening on the UNIX socket ``path`` (SO_PEERCRED)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(os.fspath(path))
        except OSError as e:
            raise NotFoundError(f"cannot connect: {e.strerror}", where=os.fspath(path),
                                hint="is containerd running? restart it yourself") from None
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid


def restart(host, engine: str, service: str, *, containerd_socket: str = CONTAINERD_SOCKET) -> str:
    """Restart ``engine``; return what was done, for the user."""
    note = host.platform.restart_engine(host, engine, service)      # a simulated node has none
    if note is not None:
        return note
    if systemd_running(host):
        proc = subprocess.run(["systemctl", "restart", service], capture_output=True, text=True)
        if proc.returncode != 0:
            raise HostagentError(f"systemctl restart {service} failed: {proc.stderr.strip()}",
                                 hint="the configuration is written; restart the service yourself")
        return f"restarted {service} through systemd"
    if engine != "containerd":
        raise StateError(f"systemd is not running, and {engine} cannot be told to reload by signal",
                         hint=f"the configuration is written; restart {engine} yourself")
    pid = socket_peer_pid(host.host(containerd_socket))
    os.kill(pid, signal.SIGHUP)
    return (f"sent SIGHUP to containerd (pid {pid}); containerd 1.6 exits on it and must be started "
            "again by its supervisor to read the new configuration")
