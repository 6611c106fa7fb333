"""Atomic, durable file writes: every file hostagent writes on a host goes through here;
and reading the files users name, which must be regular files of bounded size.

Standard library ``os`` only: the runtime shim writes config.json with it at every GPU
container's create, where importing ``tempfile`` or ``pathlib`` would cost milliseconds.

Temporary files are named ``.<target>.<pid>-<random>.tmp``. A writer killed between
creating one and renaming it (kill -9, power loss) leaves it behind; the next write of the
same target removes it: only files of that exact pattern, owned by the writing user, whose
pid no longer runs (so a concurrent writer's file is never touched).
"""

from __future__ import annotations

import os

__all__ = ["write_atomic", "write_point", "remove", "ensure_dir", "temp_path", "remove_stale_temporaries",
           "read_regular", "read_config_file", "pid_alive", "MAX_USER_FILE"]

# Crash points in the middle of a write (hostagent.faults, ``write:FILE``): tests only. The
# environment is read here so that a write costs no import of faults while none is armed.
_WRITE_FAULTS = "write:" in os.environ.get("HOSTAGENT_FAULT", "")
# Any configuration file a user names (MIG configs, hooks files, engine configs, CDI specs,
# hostagent's own config) is far smaller; a bigger one is refused, not read.
MAX_USER_FILE = 16 << 20
_S_IFMT, _S_IFREG = 0o170000, 0o100000
_KINDS = {0o010000: "FIFO", 0o020000: "character device", 0o040000: "directory",
          0o060000: "block device", 0o140000: "socket"}


def temp_path(directory: str, name: str) -> str:
    """A fresh temporary name beside ``directory/name`` (see the module docstring)."""
    return os.path.join(directory, f".{name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")


def _stale_pid(entry: str, name: str) -> int | None:
    """The writer pid in ``entry`` if it is one of ``name``'s temporary names, else None."""
    prefix = f".{name}."
    if not (entry.startswith(prefix) and entry.endswith(".tmp")):
        return None
    middle = entry[len(prefix):-4]
    pid, dash, tag = middle.partition("-")
    if not (dash and pid.isdigit() and len(tag) == 8 and all(c in "0123456789abcdef" for c in tag)):
        return None
    return int(pid)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def remove_stale_temporaries(directory: str, name: str) -> list[str]:
    """Remove what killed writers of ``directory/name`` left; returns the names removed."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    me = os.geteuid()
    for entry in entries:
        pid = _stale_pid(entry, name)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            st = os.lstat(os.path.join(directory, entry))
            if st.st_uid != me or (st.st_mode & _S_IFMT) != _S_IFREG:
                continue
            os.unlink(os.path.join(directory, entry))
            removed.append(entry)
        except OSError:
            continue
    return removed


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
    tmp = temp_path(directory, name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if durable:
                os.fsync(f.fileno())
        write_point(name)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    remove_stale_temporaries(directory, name)
    if durable:
        _fsync_dir(directory)


def write_point(name: str) -> None:
    """The crash point in the middle of a write of a file named ``name`` (tests only)."""
    if _WRITE_FAULTS:
        from . import faults
        faults.point(f"write:{name}")


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


def read_regular(path: str, limit: int = MAX_USER_FILE, *, follow: bool = True) -> tuple[bytes, os.stat_result]:
    """The bytes of ``path`` and its stat, read without ever blocking: opened non-blocking
    (a FIFO or a device named as a config file would hang a plain open or read), refused
    unless it is a regular file, and at most ``limit`` bytes. ``follow`` False: a symlink
    is refused too (for files someone else can write: OSError ELOOP). Raises OSError as
    open does (FileNotFoundError, PermissionError, ...) and ValueError saying what the file
    is instead."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
        kind = st.st_mode & _S_IFMT
        if kind != _S_IFREG:
            raise ValueError(f"is a {_KINDS.get(kind, 'special file')}, not a regular file")
        if st.st_size > limit:
            raise ValueError(f"is {st.st_size} bytes, more than the {limit} a configuration file may have")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ValueError(f"grew past the {limit} bytes a configuration file may have while read")
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_config_file(path: str, what: str, limit: int = MAX_USER_FILE) -> bytes:
    """``read_regular`` for a file a user named, with hostagent's errors (what, where, what
    to do); ``-`` reads standard input, at most ``limit`` bytes of it."""
    from .errors import ConfigError, NotFoundError
    if path == "-":
        import sys
        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:
            raise ConfigError(f"{what} on standard input is more than {limit} bytes", where="<stdin>")
        return data
    try:
        return read_regular(path, limit)[0]
    except FileNotFoundError:
        raise NotFoundError(f"{what} not found", where=path) from None
    except ValueError as e:
        raise ConfigError(f"{what} {e}", where=path, hint="name a regular file") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror}", where=path) from None
