"""The cache entries of a library folder, as ldconfig (glibc ``elf/ldconfig.c``,
``search_dir``) makes them, reading only what the image's cache does not list already.

ldconfig looks at the regular files and symlinks of the folder whose names look like
libraries (``lib*.so*``, ``ld-*.so*``, ``ld.so.*``, ``ld64.so.*``), one entry per SONAME:
``(SONAME, FOLDER/SONAME)``. A file without a DT_SONAME counts under its own name. A symlink
counts under its own name when that is the SONAME of the library it leads to, or when it is
the ``.so`` development link of it (``libcuda.so`` for ``libcuda.so.1``); otherwise as the
library it leads to. Subdirectories (hwcaps) are not scanned: their entries, if any, are the
image's own.

The image's cache already holds its own libraries: a name it lists for this folder (or for
another path of the same directory, ``/lib/x86_64-linux-gnu`` for
``/usr/lib/x86_64-linux-gnu`` on a merged-/usr image), and the file such a name links to
in the folder, are not read again. So a container's second start reads no library at all,
and its first reads the injected ones.

Everything is reached through the root's descriptors (inroot, fileat): no symlink is
followed out of the root, no device or FIFO is opened, every read is bounded (elfso), and
so is the run's whole reading (budget): a file is parsed once, by its inode, whatever
names and links reach it.
"""

import posix

from . import elfso
from .budget import Budget
from .cachefile import Cache, Entry
from .fileat import fsdecode, fsencode, regular_at, reopen
from .inroot import Root

__all__ = ["folder_entries", "by_directory", "MAX_NAMES"]

MAX_NAMES = 1 << 16                   # a folder with more entries is left to ldconfig
MAX_ALIASES = 8                       # paths of the image's cache checked per folder


def by_directory(image: Cache) -> dict[bytes, set[str]]:
    """The names ``image`` lists, by directory (the glibc-hwcaps and legacy hwcap entries,
    the image's own subdirectories, left out)."""
    dirs: dict[bytes, set[str]] = {}
    for _, path, _, _, hwcap in image.entries:
        if not hwcap:
            parent, _, name = path.rpartition(b"/")
            dirs.setdefault(parent, set()).add(fsdecode(name))
    return dirs


def folder_entries(root: Root, folder: str, cached: dict[bytes, set[str]], seen: set,
                   budget: Budget) -> list[Entry]:
    """The entries ldconfig makes for ``folder`` (nothing when it does not exist, or is
    a directory ``seen`` already), without the libraries the image's cache lists for it
    (``cached``: by_directory), within the run's ``budget``. Raises elfso.Unsupported
    where ldconfig has to decide (budget.Exhausted among them)."""
    try:
        path_fd = root.opendir(folder)
    except OSError:
        return []                                    # ldconfig skips it too
    try:
        dir_fd = posix.open(".", posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC, dir_fd=path_fd)
    finally:
        posix.close(path_fd)
    try:
        st = posix.fstat(dir_fd)
        if (st.st_dev, st.st_ino) in seen:
            return []
        seen.add((st.st_dev, st.st_ino))
        return _Folder(root, folder, dir_fd, budget).entries(_listed(root, folder, cached, st))
    finally:
        posix.close(dir_fd)


class _Folder:
    __slots__ = ("root", "folder", "fd", "sonames", "budget")

    def __init__(self, root: Root, folder: str, fd: int, budget: Budget):
        self.root, self.folder, self.fd, self.budget = root, folder, fd, budget
        self.sonames: dict[str, tuple[bytes, int] | None] = {}    # file name -> (SONAME, flags)

    def entries(self, listed: set[str]) -> list[Entry]:
        files, links = [], []
        with posix.scandir(self.fd) as names:
            for count, entry in enumerate(names):
                if count >= MAX_NAMES:
                    raise elfso.Unsupported(f"{self.folder} has more than {MAX_NAMES} entries")
                self.budget.name()
                name = entry.name
                if not _looks_like_library(name):
                    continue
                if entry.is_symlink():
                    links.append(name)
                elif entry.is_file(follow_symlinks=False):
                    files.append(name)
        found: dict[bytes, int] = {}
        linked = set()
        for name in links:
            if name in listed:
                target = posix.readlink(name, dir_fd=self.fd)
                if "/" not in target:
                    linked.add(target)                 # the library it names is listed too
                continue
            info = self._through_link(name)
            if info is not None:
                soname, flags = info
                raw = fsencode(name)
                if soname is None or raw == soname or (raw.endswith(b".so") and soname.startswith(raw)):
                    soname = raw                       # its own entry (ldconfig's is_link)
                found.setdefault(soname, flags)
        for name in files:
            if name in listed or name in linked:
                continue
            info = self._file(name)
            if info is not None:
                found.setdefault(info[0] or fsencode(name), info[1])
        prefix = fsencode(self.folder.rstrip("/")) + b"/"
        return [(soname, prefix + soname, flags, 0, 0) for soname, flags in found.items()
                if fsdecode(soname) not in listed]

    def _file(self, name: str) -> tuple[bytes | None, int] | None:
        """(SONAME or None, flags) of regular file ``name`` in the folder, None when it is
        not a library."""
        if name not in self.sonames:
            self.sonames[name] = self._describe(regular_at(self.fd, name))
        return self.sonames[name]

    def _through_link(self, name: str) -> tuple[bytes | None, int] | None:
        """The (SONAME, flags) of the library symlink ``name`` leads to: through names in
        the folder itself where it can, else resolved inside the root."""
        for _ in range(8):
            try:
                target = posix.readlink(name, dir_fd=self.fd)
            except OSError:                             # EINVAL: no longer a link
                return self._file(name)
            if "/" in target:
                break
            if target in self.sonames:
                return self.sonames[target]
            name = target
        else:
            return None
        return self._describe(self.root.find_file(f"{self.folder.rstrip('/')}/{name}"))

    def _describe(self, found) -> tuple[bytes | None, int] | None:
        """What elfso reads of the file ``found`` (regular_at's), once per inode a run."""
        if found is None:
            return None
        path_fd, st = found
        key = (st.st_dev, st.st_ino)
        try:
            if key in self.budget.parsed:
                return self.budget.parsed[key]
            self.budget.file()
            fd = reopen(path_fd)
        finally:
            posix.close(path_fd)
        try:
            described = elfso.read(fd, st.st_size, self.budget)
        finally:
            posix.close(fd)
        self.budget.parsed[key] = described
        return described


def _listed(root: Root, folder: str, cached: dict[bytes, set[str]], st) -> set[str]:
    """Names the image's cache lists in this directory: under this path, or under another
    one ending in the same name that is the same directory."""
    base = fsencode(folder.rpartition("/")[2])
    dirs = [parent for parent in cached if parent.rpartition(b"/")[2] == base]
    listed: set[str] = set()
    for parent in dirs[:MAX_ALIASES]:
        try:
            fd = root.opendir(fsdecode(parent))
        except OSError:
            continue
        try:
            other = posix.fstat(fd)
        finally:
            posix.close(fd)
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            listed |= cached[parent]
    return listed


def _looks_like_library(name: str) -> bool:
    """ldconfig's ``_dl_is_dso``, less the prelink program's temporary files."""
    if ".#prelink#" in name:
        return False
    return (name.startswith(("lib", "ld-")) and ".so" in name) or name.startswith(("ld.so.", "ld64.so."))
