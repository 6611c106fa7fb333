"""Small file operations relative to a held directory descriptor (see inroot).

Every name here is a single component inside a directory the caller resolved safely.
New entries appear atomically: written under a random temporary name (O_EXCL|O_NOFOLLOW,
so a planted link at a guessed name can neither be followed nor reused), then renamed over
the final name. rename replaces a symlink at the final name; it never writes through it.
"""

import posix

_S_IFMT, _S_IFREG = 0o170000, 0o100000


def fsencode(name: str) -> bytes:
    """``os.fsencode`` on Linux (UTF-8, undecodable bytes kept as surrogates)."""
    return name.encode("utf-8", "surrogateescape")


def fsdecode(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def temp_name(name: str) -> str:
    # 200 bytes, not characters: the whole name must fit in a 255-byte directory entry.
    return f".{fsdecode(fsencode(name)[:200])}.hostagent-{posix.urandom(6).hex()}"


def write_at(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Atomically replace ``name`` in ``dir_fd`` with ``data``. No fsync: the container root
    is rebuilt by the hook at every start, so losing a write to a power cut costs nothing."""
    tmp = temp_name(name)
    fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC,
                    mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view):]
            posix.fchmod(fd, mode)                  # whatever the umask was
        finally:
            posix.close(fd)
        posix.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise


def read_at(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Contents of regular file ``name`` (at most ``limit`` + 1 bytes), or None when it is
    missing or not a regular file. Never follows a link, and never opens anything else for
    reading (open_regular): a FIFO would see a reader, a device node its driver's open."""
    try:
        opened = open_regular(dir_fd, name)
    except OSError:
        return None
    if opened is None:
        return None
    fd, size = opened
    try:
        return posix.read(fd, min(size, limit) + 1)
    finally:
        posix.close(fd)


def open_regular(dir_fd: int, name: str) -> tuple[int, int] | None:
    """(a read-only descriptor, the size) of regular file ``name``, or None when it is
    missing or not a regular file (``regular_at``, then ``reopen``)."""
    found = regular_at(dir_fd, name)
    if found is None:
        return None
    path_fd, st = found
    try:
        return reopen(path_fd), st.st_size
    finally:
        posix.close(path_fd)


def regular_at(dir_fd: int, name: str):
    """(a path-only descriptor, its stat) of regular file ``name``, or None when it is
    missing or not a regular file. Opened as a path only, so a device node or a FIFO is
    never opened for reading, even one swapped in meanwhile; its stat tells which file it
    is (a reader that has seen that inode need not open it)."""
    try:
        path_fd = posix.open(name, posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    st = posix.fstat(path_fd)
    if (st.st_mode & _S_IFMT) != _S_IFREG:
        posix.close(path_fd)
        return None
    return path_fd, st


def reopen(path_fd: int) -> int:
    """A read-only descriptor of the file ``path_fd`` holds (through /proc/self/fd, so it is
    the very file that was checked)."""
    return posix.open(f"/proc/self/fd/{path_fd}", posix.O_RDONLY | posix.O_NONBLOCK | posix.O_CLOEXEC)


def exists_at(dir_fd: int, name: str) -> bool:
    """Whether an entry called ``name`` exists (a dangling link counts)."""
    try:
        posix.close(posix.open(name, posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=dir_fd))
    except FileNotFoundError:
        return False
    return True


def symlink_at(dir_fd: int, target: str, name: str) -> str:
    """Make ``name`` a symlink to ``target``, never seen half-made: where nothing is there,
    in one step (symlinkat creates, or fails on anything there, dangling links included);
    over another symlink, under a temporary name renamed into place. Returns "created",
    "replaced" or "unchanged"; raises IsADirectoryError / FileExistsError when a directory
    or a non-link file is there (left alone: see links.py)."""
    try:
        current = posix.readlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        current = None
    except OSError as e:
        if e.errno != 22:                        # EINVAL: it exists and is not a symlink
            raise
        kind = posix.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode & _S_IFMT
        if kind == 0o040000:
            raise IsADirectoryError(21, "is a directory", name) from None
        raise FileExistsError(17, "exists and is not a symlink", name) from None
    if current == target:
        return "unchanged"
    if current is None:
        try:
            posix.symlink(target, name, dir_fd=dir_fd)
            return "created"
        except FileExistsError:
            pass                                  # raced in meanwhile: replace it below
    tmp = temp_name(name)
    posix.symlink(target, tmp, dir_fd=dir_fd)       # O_EXCL-like: fails on a planted name
    try:
        # rename replaces a link (or a file that raced in) and refuses a directory; it
        # never writes through a link at ``name``.
        posix.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    return "created" if current is None else "replaced"


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        posix.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
