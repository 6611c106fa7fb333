"""Atomic, durable file writes: every file hostagent writes on a host goes through here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic", "ensure_dir"]


def ensure_dir(path: str | os.PathLike, mode: int = 0o755) -> Path:
    path = Path(path)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    return path


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = 0o644, *,
                 durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part.

    Temp file in the same directory, fsync, chmod, rename over the target, fsync the
    directory. On any failure the temp file is removed and the target is untouched.
    ``durable=False`` skips the fsyncs: the rename still makes the write atomic for other
    processes and survives the writer's crash, but not a power loss (the simulator's
    state, which a real power loss would wipe anyway, needs no more).
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
