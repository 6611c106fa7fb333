"""UNIX socket paths of any length for the simulated node.

``sun_path`` holds 107 bytes, so a socket deep inside a simulated root (a long temporary
directory plus ``run/nvidia-persistenced/socket``) cannot be bound by its path. A path that
is too long is reached through ``/proc/self/fd/<dirfd>/<name>`` instead: the kernel follows
the descriptor of its directory, and the socket still appears at the real path. No
``chdir``, which would change every thread's working directory.
"""

from __future__ import annotations

import contextlib
import os
import socket

__all__ = ["bind", "connect"]

_SUN_PATH_MAX = 107


@contextlib.contextmanager
def _short(path: str | os.PathLike):
    path = os.fspath(path)
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield path
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def bind(sock: socket.socket, path: str | os.PathLike) -> None:
    with _short(path) as short:
        sock.bind(short)


def connect(sock: socket.socket, path: str | os.PathLike) -> None:
    with _short(path) as short:
        sock.connect(short)
