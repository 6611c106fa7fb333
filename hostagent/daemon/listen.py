"""The API socket and the one-daemon-per-node lock.

The socket is bound under a temporary name, given its group and mode, and renamed into
place, so no client ever sees it with the wrong permissions and a stale socket from a
crashed daemon is replaced atomically. Beside the API socket the daemon serves root's own,
``admin.sock`` (0600): connecting needs write permission on the socket, so no other user
can fill its accept queue, and root (its CLI, the kubelet plugins, the liveness probe) is
served however the API socket is flooded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

from ..errors import StateError
from ..fileio import ensure_dir
from ..groups import group_id
from ..hostroot import HostRoot

__all__ = ["bind_socket", "instance_lock", "group_id"]

log = logging.getLogger("hostagent.daemon")


def bind_socket(path: Path, group: str | None, mode: int, backlog: int = 1024,
                host: HostRoot | None = None) -> tuple[socket.socket, int | None]:
    """A listening socket at ``path``: ``mode``, group ``group`` (of ``host``); root-only
    (group bits cleared) when the group does not exist, or is None (root's own socket).
    Returns the socket and the group's id."""
    ensure_dir(path.parent, 0o755)
    if group is None:
        gid, mode = None, mode & 0o700
    elif (gid := group_id(group, host)) is None:
        mode &= 0o700
        log.warning("group %r does not exist: the API socket is root-only (mode %04o); "
                    "create the group (groupadd --system %s) and restart to let its members in",
                    group, mode, group, extra={"fields": {"group": group}})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    doing, hint = "create the API socket", "check api.socket (at most 107 bytes) and its directory"
    try:
        sock.bind(str(tmp))
        if gid is not None:           # only root, or a member of the group, may give a file to it
            doing, hint = (f"give the API socket to group '{group}'",
                           f"uid {os.geteuid()} is not in group '{group}': run the daemon as root, or set "
                           "api.group to a group of this user")
            os.chown(tmp, -1, gid)
            doing, hint = "create the API socket", "check api.socket (at most 107 bytes) and its directory"
        os.chmod(tmp, mode)
        sock.listen(backlog)
        os.rename(tmp, path)
    except BaseException as e:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(e, OSError):
            raise StateError(f"cannot {doing}: {e.strerror or e}", where=str(path), hint=hint) from None
        raise
    sock.setblocking(False)
    return sock, gid


@contextlib.contextmanager
def instance_lock(host: HostRoot):
    """Held for the daemon's life: a second daemon on the node fails at once, naming the first."""
    path = ensure_dir(host.run_dir, 0o755) / "daemon.pid"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise StateError(f"another hostagent daemon (pid {holder}) is running on this node",
                             where=str(path), hint="stop it first (systemctl stop hostagent)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
