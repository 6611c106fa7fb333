"""Atomic, durable file writes: every file hostagent writes on a host goes through here.

Standard library ``os`` only: the runtime shim writes config.json with it at every GPU
container's create, where importing ``tempfile`` or ``pathlib`` would cost milliseconds.
"""

from __future__ import annotations

import os

__all__ = ["write_atomic", "remove", "ensure_dir"]


def ensure_dir(path: str | os.PathLike, mode: int = 0o755):
    """Create ``path`` (and parents) if needed; returns it as a Path."""
    from pathlib import Path
    path = Path(path)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    return path


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = 0o644, *,
                 durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part.

    Temp file in the same directory (exclusive create, unguessable name), fsync, chmod,
    rename over the target, fsync the directory. On any failure the temp file is removed
    and the target is untouched. ``durable=False`` skips the fsyncs: the rename still makes
    the write atomic for other processes and survives the writer's crash, but not a power
    loss (the simulator's state, which a real power loss would wipe anyway, needs no more).
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    if isinstance(data, str):
        data = data.encode()
    tmp = os.path.join(directory, f".{name}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        _fsync_dir(directory)


def remove(path: str | os.PathLike) -> None:
    """Unlink ``path`` (atomic for readers) and make the removal durable, as writes are.
    A file already gone is the same outcome."""
    path = os.fspath(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
