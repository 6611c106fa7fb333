"""Small file operations relative to a held directory descriptor (see inroot).

Every name here is a single component inside a directory the caller resolved safely.
New entries appear atomically: written under a random temporary name (O_EXCL|O_NOFOLLOW,
so a planted link at a guessed name can neither be followed nor reused), then renamed over
the final name. rename replaces a symlink at the final name; it never writes through it.
"""

from __future__ import annotations

import os

_S_IFMT, _S_IFREG = 0o170000, 0o100000


def temp_name(name: str) -> str:
    # 200 bytes, not characters: the whole name must fit in a 255-byte directory entry.
    return f".{os.fsdecode(os.fsencode(name)[:200])}.hostagent-{os.urandom(6).hex()}"


def write_at(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Atomically replace ``name`` in ``dir_fd`` with ``data``. No fsync: the container root
    is rebuilt by the hook at every start, so losing a write to a power cut costs nothing."""
    tmp = temp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)                  # whatever the umask was
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise


def read_at(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Contents of regular file ``name`` (at most ``limit`` + 1 bytes), or None when it is
    missing or not a regular file. Never follows a link and never blocks on a FIFO."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_mode & _S_IFMT) != _S_IFREG:
            return None
        return os.read(fd, min(st.st_size, limit) + 1)
    finally:
        os.close(fd)


def exists_at(dir_fd: int, name: str) -> bool:
    """Whether an entry called ``name`` exists (a dangling link counts)."""
    try:
        os.close(os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd))
    except FileNotFoundError:
        return False
    return True


def symlink_at(dir_fd: int, target: str, name: str) -> str:
    """Make ``name`` a symlink to ``target``: made under a temporary name and renamed into
    place, so ``name`` is never seen half-made. Returns "created", "replaced" or
    "unchanged"; raises IsADirectoryError / FileExistsError when a directory or a non-link
    file is there (left alone: see links.py)."""
    try:
        current = os.readlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        current = None
    except OSError as e:
        if e.errno != 22:                        # EINVAL: it exists and is not a symlink
            raise
        kind = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode & _S_IFMT
        if kind == 0o040000:
            raise IsADirectoryError(21, "is a directory", name) from None
        raise FileExistsError(17, "exists and is not a symlink", name) from None
    if current == target:
        return "unchanged"
    tmp = temp_name(name)
    os.symlink(target, tmp, dir_fd=dir_fd)       # O_EXCL-like: fails on a planted name
    try:
        # rename replaces a link (or a file that raced in) and refuses a directory; it
        # never writes through a link at ``name``.
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    return "created" if current is None else "replaced"


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
