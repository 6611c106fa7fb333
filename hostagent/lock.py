"""The node lock: one writer of node state (MIG layout, CDI specs, allocations) at a time.

A ``flock`` on ``/run/hostagent/node.lock``; the kernel drops it when the holder exits, so a
crashed holder never leaves the node locked. The holder writes its pid and purpose into
the file so a waiting command can say who it waits for.

The lock is re-entrant within a thread: a writer that already holds it (a MIG apply) may
call code that takes it too (a CDI refresh after the layout changed) without deadlocking
on its own flock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import threading
import time
from pathlib import Path
from typing import Callable

from .errors import StateError
from .fileio import ensure_dir
from .hostroot import HostRoot

__all__ = ["node_lock"]

_held = threading.local()    # lock paths this thread holds, with nesting depth


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
    except IsADirectoryError:          # a folder's own lock says nothing of its holder
        return "another process"


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False


def _acquire(fd: int, path, purpose: str, timeout: float | None, on_wait) -> None:
    if _try(fd):
        return
    if on_wait is not None:
        on_wait(_holder(fd))
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)      # as long as it takes; a signal still interrupts it
        return
    deadline = time.monotonic() + timeout
    while not _try(fd):
        if time.monotonic() >= deadline:
            raise StateError(f"the node is locked by {_holder(fd)} (waited {timeout:g} s)", where=str(path),
                             hint=f"wait for it to finish, then retry ({purpose})")
        time.sleep(0.05)


@functools.lru_cache(maxsize=16)
def _lock_file(host: HostRoot) -> tuple[Path, str]:
    """The lock file of ``host`` and its real path (the re-entrancy key), found once: the
    lock is taken at every allocation, and resolving the path through a host root that is
    not / was most of its cost."""
    path = ensure_dir(host.run_dir, 0o755) / "node.lock"
    return path, os.path.realpath(path)


@contextlib.contextmanager
def node_lock(host: HostRoot, purpose: str, *, timeout: float | None = 60.0,
              on_wait: Callable[[str], None] | None = None):
    """Hold the node lock for ``purpose``; wait up to ``timeout`` seconds (None: as long as
    it takes). ``on_wait(holder)`` is called once if the lock is taken, with the holder's
    pid and purpose, so a command can say whom it waits for."""
    folder = not host.platform.is_node(host)
    if folder:          # a folder that is not a simulated node (yet): its own flock, nothing written in it
        path = key = os.path.realpath(host.root)
    else:
        path, key = _lock_file(host)
        ensure_dir(path.parent, 0o755)      # again each time: /run may have been cleaned
    depth = getattr(_held, "paths", None)
    if depth is None:
        depth = _held.paths = {}
    if depth.get(key):
        depth[key] += 1
        try:
            yield
        finally:
            depth[key] -= 1
        return
    fd = os.open(path, (os.O_RDONLY if folder else os.O_RDWR | os.O_CREAT) | os.O_CLOEXEC, 0o600)
    try:
        _acquire(fd, path, purpose, timeout, on_wait)
        if not folder:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: {purpose}\n".encode(), 0)
        depth[key] = 1
        try:
            yield
        finally:
            depth.pop(key, None)
            if not folder:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
