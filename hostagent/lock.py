"""The node lock: one writer of node state (MIG layout, CDI specs, allocations) at a time.

A ``flock`` on ``/run/hostagent/node.lock``; the kernel drops it when the holder exits, so a
crashed holder never leaves the node locked. The holder writes its pid and purpose into
the file so a waiting command can say who it waits for.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time

from .errors import StateError
from .fileio import ensure_dir
from .hostroot import HostRoot

__all__ = ["node_lock"]


@contextlib.contextmanager
def node_lock(host: HostRoot, purpose: str, *, timeout: float | None = 60.0):
    """Hold the node lock for ``purpose``; wait up to ``timeout`` seconds (None: forever)."""
    path = ensure_dir(host.run_dir, 0o755) / "node.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if deadline is not None and time.monotonic() >= deadline:
                holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
                raise StateError(f"the node is locked by {holder}", where=str(path),
                                 hint=f"wait for it to finish, then retry ({purpose})")
            time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {purpose}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
