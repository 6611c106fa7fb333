"""``--folder DIR``: make the injected libraries resolve through the container's ld.so.cache.

1. The folders go into ``/etc/ld.so.conf.d/00-hostagent.conf`` (written atomically, only
   when its content changes), and ``/etc/ld.so.conf`` is created with the usual include
   line when the image has none, so an ``ldconfig`` run later inside the container keeps
   them. Both are written through the in-root resolver.
2. The cache: the image's own ``/etc/ld.so.cache`` with the folders' libraries added, in
   front of any the image has under the same SONAME, as ldconfig would add them for folders
   named on its command line (folderscan, cachefile). The image's other entries stay as the
   image built them. No process runs, and a container's second start reads no library.
3. Where this cannot be done faithfully (an image cache that is damaged, from another byte
   order or in the old format alone; an ELF library of another kind than the host's own;
   a host other than x86-64 or AArch64), and for ``update-ldcache`` without folders, the
   host's ldconfig rebuilds the cache inside the sandbox (sandbox.py) as before, with the
   folders on its command line.
4. The new cache is installed as ``/etc/ld.so.cache`` by the hook, atomically, through the
   resolver, and only when it differs from the old one.
"""

import posix
import sys

from . import cachefile, elfso
from .errors import HookError
from .fileat import exists_at, read_at, write_at
from .inroot import Root

CONF_DIR = "/etc/ld.so.conf.d"
DROP_IN = "00-hostagent.conf"
MAIN_CONF = b"include /etc/ld.so.conf.d/*.conf\n"
CACHE = "ld.so.cache"


def drop_in(folders: list[str]) -> bytes:
    return ("# Written by hostagent-hook at container start: the injected driver libraries.\n"
            + "".join(f"{f}\n" for f in folders)).encode()


def write_config(root: Root, folders: list[str]) -> None:
    etc = _dir(root, "/etc")
    try:
        if not exists_at(etc, "ld.so.conf"):
            try:
                fd = posix.open("ld.so.conf", posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW
                                | posix.O_CLOEXEC, 0o644, dir_fd=etc)
            except FileExistsError:
                pass                              # appeared meanwhile: the image's own
            else:
                try:
                    posix.write(fd, MAIN_CONF)
                finally:
                    posix.close(fd)
    finally:
        posix.close(etc)
    confd = _dir(root, CONF_DIR)
    try:
        content = drop_in(folders)
        if read_at(confd, DROP_IN, len(content)) != content:
            write_at(confd, DROP_IN, content)
    except OSError as e:
        raise HookError(f"cannot write {CONF_DIR}/{DROP_IN} in the container: {e.strerror or e}") from None
    finally:
        posix.close(confd)


def install_cache(root: Root, cache: bytes, old: bytes | None = None) -> None:
    """Install ``cache`` unless it equals the current one (``old``, read here if not
    given): replacing a file by rename makes ext4 flush it, milliseconds on every start."""
    etc = _dir(root, "/etc")
    try:
        if old is None:
            old = read_at(etc, CACHE, len(cache))
        if old != cache:
            write_at(etc, CACHE, cache)
    except OSError as e:
        raise HookError(f"cannot install /etc/ld.so.cache in the container: {e.strerror or e}") from None
    finally:
        posix.close(etc)


def check(root: Root) -> None:
    """Before anything is written: the folder ``write_config`` writes in can be reached or
    made (not a file, not a loop), so a cache refresh that would fail changes no link."""
    try:
        fd = root.probe(CONF_DIR)
    except OSError as e:
        raise HookError(f"cannot reach {CONF_DIR} in the container: {e.strerror or e}") from None
    if fd is not None:
        posix.close(fd)


def update(root: Root, folders: list[str], ldconfig_fd: int, timeout: float, budget=None) -> None:
    if folders:
        write_config(root, folders)
    old = _current(root)
    cache = merged(root, folders, old, budget) if folders else None
    if cache is None:
        cache = _rebuilt(root, folders, ldconfig_fd, timeout)
    install_cache(root, cache, old if old is not None else b"")


def merged(root: Root, folders: list[str], old: bytes | None, budget=None) -> bytes | None:
    """The image's cache (``old``, None: there is none) with the folders' libraries, or
    None when ldconfig has to build it (the image needs more reading than the run's
    ``budget`` allows, among other reasons)."""
    if not elfso.HOST_FLAGS or sys.byteorder != "little":
        return None
    image = cachefile.parse(old) if old is not None else cachefile.Cache([], [])
    if image is None:
        return None
    from .budget import Budget
    from .folderscan import by_directory, folder_entries
    cached, seen, budget = by_directory(image), set(), budget or Budget()
    try:
        added = [entry for folder in folders for entry in folder_entries(root, folder, cached, seen, budget)]
    except elfso.Unsupported:
        return None
    except OSError as e:
        raise HookError(f"cannot read the libraries of {', '.join(folders)} in the container: "
                        f"{e.strerror or e}") from None
    new = cachefile.merge(image, added)
    if new is None:
        return old if old is not None else cachefile.render(image)
    return cachefile.render(new)


def _current(root: Root) -> bytes | None:
    etc = _dir(root, "/etc")
    try:
        return read_at(etc, CACHE, cachefile.MAX_BYTES)
    finally:
        posix.close(etc)


def _rebuilt(root: Root, folders: list[str], ldconfig_fd: int, timeout: float) -> bytes:
    """The cache the host's ldconfig builds in the sandbox, from its sealed copy."""
    from . import hostbin
    from .sandbox import run_ldconfig           # ctypes and friends: only when needed
    sealed = hostbin.sealed_copy(ldconfig_fd)
    try:
        return run_ldconfig(root.fd, [ldconfig_fd] if sealed is None else [sealed, ldconfig_fd], folders, timeout)
    finally:
        if sealed is not None:
            posix.close(sealed)


def _dir(root: Root, path: str) -> int:
    try:
        return root.opendir(path, create=True)
    except OSError as e:
        raise HookError(f"cannot reach {path} in the container: {e.strerror or e}") from None
