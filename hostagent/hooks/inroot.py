"""Resolve container paths inside the container root, as chroot would, without a chroot.

The hook runs as host root on a filesystem the image controls. A path such as
``/usr/lib/x86_64-linux-gnu/libcuda.so`` may cross symlinks the image planted (to ``/``,
``../../..``, ``/proc/1/root/etc``), and another process may swap a directory for a symlink
while the hook runs. So a path is never handed to the kernel as a string. It is walked one
component at a time from a held descriptor of the root:

* each step is ``openat(dir_fd, name, O_PATH|O_NOFOLLOW)``: a single name, never followed;
* a symlink is read through the descriptor just opened (``readlinkat(fd, "")``, so it is
  exactly the link that was checked) and its target is walked in turn: an absolute target
  restarts at the container root, a relative one continues from the link's directory;
* ``..`` pops a stack of descriptors this walk opened itself and stops at the root, so it
  can never reach the root's real parent (``openat(fd, "..")`` could, after a rename);
* magic links (``/proc/<pid>/root``) are never followed by the kernel because of
  O_NOFOLLOW; their text (``/``) is walked like any absolute target, inside the root;
* at most 40 symlinks per walk, like the kernel, and a bounded number of steps.

The result is a descriptor of the directory; callers create and rename entries with
``*at`` calls relative to it, so later swaps of any path component cannot redirect them.
"""

import errno
import posix

from .errors import HookError
from .fileat import fsencode, regular_at

MAX_HOPS = 40
MAX_STEPS = 4096
NAME_MAX = 255
_OPEN, _CREATE, _PROBE = range(3)           # what a walk does at a missing directory
_STEP = posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC
_S_IFMT, _S_IFDIR, _S_IFLNK = 0o170000, 0o040000, 0o120000


def _open_root(path: str, bundle: str | None) -> int:
    """The container root, opened once without following any symlink: inside the bundle
    (``bundle/<relative root>``: the bundle as the engine gave it, then every component of
    the root below it) or, for an absolute root, every component from ``/``, which is the
    root runc itself accepts (it refuses one that is or passes through a symlink). A root
    swapped for a symlink at any moment is refused, never followed."""
    if bundle and path.startswith(bundle.rstrip("/") + "/"):
        start, rest = bundle, path[len(bundle.rstrip("/")) + 1:]
    else:
        start, rest = "/", path
    try:
        fd = posix.open(start, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    except OSError as e:
        raise HookError(f"cannot open {'the bundle ' if start != '/' else ''}{start}: {e.strerror}") from None
    try:
        for name in rest.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                raise HookError(f"container root {path} climbs out with '..'; refusing it")
            try:
                step = posix.open(name, _STEP, dir_fd=fd)
            except FileNotFoundError:
                raise HookError(f"container root {path} does not exist") from None
            except OSError as e:
                raise HookError(f"cannot open container root {path}: {e.strerror}") from None
            kind = posix.fstat(step).st_mode & _S_IFMT
            posix.close(fd)
            fd = step
            if kind == _S_IFLNK:
                raise HookError(f"container root {path} is or passes through a symlink ({name}); the hook "
                                "never follows one out of the bundle (runtimes refuse such a root)")
            if kind != _S_IFDIR:
                raise HookError(f"container root {path} is not a directory")
        return fd
    except BaseException:
        posix.close(fd)
        raise


class Root:
    """A held container root: opened once (see _open_root), checked, and every later
    operation made relative to that descriptor. ``path`` is only for messages and mount
    bookkeeping."""

    __slots__ = ("fd", "path")

    def __init__(self, path: str, bundle: str | None = None):
        fd = _open_root(path, bundle)
        st, host = posix.fstat(fd), posix.stat("/")
        if (st.st_dev, st.st_ino) == (host.st_dev, host.st_ino):
            posix.close(fd)
            raise HookError(f"container root {path} is the host's /; refusing to touch it")
        self.fd, self.path = fd, path

    def close(self) -> None:
        if self.fd >= 0:
            posix.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Root":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def opendir(self, path: str, *, create: bool = False) -> int:
        """A new O_PATH descriptor of directory ``path`` (a container path), made with
        mode 0755 where missing if ``create``. Raises OSError (FileNotFoundError,
        NotADirectoryError, ELOOP) when the walk cannot finish."""
        return self._walk(path.split("/"), _CREATE if create else _OPEN)

    def probe(self, path: str) -> int | None:
        """What ``opendir(path, create=True)`` would meet, with nothing created: a new
        descriptor of ``path`` when it exists, None when it can be made, or the OSError
        the creating walk would raise for the path's shape (a file or a link loop on the
        way, even past a missing directory and back out of it with ``..``)."""
        return self._walk(path.split("/"), _PROBE)

    def find_file(self, path: str):
        """(a path-only descriptor, its stat) of the regular file at container path ``path``
        (fileat.regular_at), every symlink on the way followed inside the root, the last one
        too; None when there is no such file (missing, a loop, a directory, a device)."""
        for _ in range(MAX_HOPS + 1):
            parent, _, name = path.rpartition("/")
            if name in ("", ".", ".."):
                return None
            try:
                dir_fd = self._walk(parent.split("/"), _OPEN)
            except OSError:
                return None
            try:
                target = posix.readlink(name, dir_fd=dir_fd)
            except OSError as e:          # EINVAL: not a link (regular_at checks again)
                return regular_at(dir_fd, name) if e.errno == errno.EINVAL else None
            finally:
                posix.close(dir_fd)
            path = target if target.startswith("/") else f"{parent}/{target}"
        return None

    def _walk(self, parts: list[str], mode: int) -> int | None:
        stack = [self.fd]                # stack[1:] are descriptors this walk owns
        todo = parts[::-1]
        hops = steps = 0
        below = 0                        # probe: depth under the first missing directory
        try:
            while todo:
                name = todo.pop()
                steps += 1
                if steps > MAX_STEPS:
                    raise OSError(errno.ENAMETOOLONG, "path too long after following links")
                if name in ("", "."):
                    continue
                if below:
                    # Directories the creating walk would make: new and empty, so a name
                    # goes one deeper and ``..`` back up, until it is back where it was.
                    if name == "..":
                        below -= 1
                    elif len(fsencode(name)) > NAME_MAX:
                        raise OSError(errno.ENAMETOOLONG, "file name too long", name)
                    else:
                        below += 1
                        todo.append("")          # the step create spends opening it
                    continue
                if name == "..":
                    if len(stack) > 1:
                        posix.close(stack.pop())
                    continue
                try:
                    fd = posix.open(name, _STEP, dir_fd=stack[-1])
                except FileNotFoundError:
                    if mode == _OPEN:
                        raise
                    if mode == _PROBE:                 # check the rest, make nothing
                        below = 1
                        todo.append("")
                        continue
                    try:
                        posix.mkdir(name, 0o755, dir_fd=stack[-1])
                    except FileExistsError:
                        pass                     # raced with another creator: look again
                    todo.append(name)
                    continue
                kind = posix.fstat(fd).st_mode & _S_IFMT
                if kind == _S_IFDIR:
                    stack.append(fd)
                    continue
                if kind != _S_IFLNK:
                    posix.close(fd)
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
                try:
                    target = posix.readlink("", dir_fd=fd)
                finally:
                    posix.close(fd)
                hops += 1
                if hops > MAX_HOPS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", name)
                if target.startswith("/"):
                    while len(stack) > 1:
                        posix.close(stack.pop())
                todo.extend(target.split("/")[::-1])
            if below:
                return None
            return stack.pop() if len(stack) > 1 else posix.dup(self.fd)
        finally:
            for fd in stack[1:]:
                posix.close(fd)


def split(path: str) -> tuple[list[str], str]:
    """(components of the parent, final name) of a container path. The final name is a
    plain name, never ``.`` or ``..``, and short enough for a directory entry; the parent's
    components still hold ``..``."""
    parts = [p for p in path.split("/") if p and p != "."]
    if not parts or parts[-1] == "..":
        raise HookError(f"container path {path!r} does not name a file")
    if len(parts[-1]) > NAME_MAX // 4 and len(fsencode(parts[-1])) > NAME_MAX:
        raise HookError(f"container path {path!r}: its file name is longer than {NAME_MAX} bytes")
    return parts[:-1], parts[-1]
