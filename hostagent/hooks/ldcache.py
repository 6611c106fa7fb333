"""``--folder DIR``: make the injected libraries resolve through the container's ld.so.cache.

1. The folders go into ``/etc/ld.so.conf.d/00-hostagent.conf`` (written atomically, only
   when its content changes), and ``/etc/ld.so.conf`` is created with the usual include
   line when the image has none, so an ``ldconfig`` run later inside the container keeps
   them. Both are written through the in-root resolver.
2. The host's ldconfig rebuilds the cache inside the sandbox (sandbox.py); the folders are
   also passed on its command line, so they are in the cache even when the image's
   ld.so.conf does not include ld.so.conf.d.
3. The new cache is installed as ``/etc/ld.so.cache`` by the hook, atomically, through the
   resolver: ldconfig itself writes nothing in the container.
"""

from __future__ import annotations

import os

from .errors import HookError
from .fileat import exists_at, read_at, write_at
from .inroot import Root

CONF_DIR = "/etc/ld.so.conf.d"
DROP_IN = "00-hostagent.conf"
MAIN_CONF = b"include /etc/ld.so.conf.d/*.conf\n"


def drop_in(folders: list[str]) -> bytes:
    return ("# Written by hostagent-hook at container start: the injected driver libraries.\n"
            + "".join(f"{f}\n" for f in folders)).encode()


def write_config(root: Root, folders: list[str]) -> None:
    etc = _dir(root, "/etc")
    try:
        if not exists_at(etc, "ld.so.conf"):
            try:
                fd = os.open("ld.so.conf", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644, dir_fd=etc)
            except FileExistsError:
                pass                              # appeared meanwhile: the image's own
            else:
                try:
                    os.write(fd, MAIN_CONF)
                finally:
                    os.close(fd)
    finally:
        os.close(etc)
    confd = _dir(root, CONF_DIR)
    try:
        content = drop_in(folders)
        if read_at(confd, DROP_IN, len(content)) != content:
            write_at(confd, DROP_IN, content)
    except OSError as e:
        raise HookError(f"cannot write {CONF_DIR}/{DROP_IN} in the container: {e.strerror or e}") from None
    finally:
        os.close(confd)


def install_cache(root: Root, cache: bytes) -> None:
    etc = _dir(root, "/etc")
    try:
        # A container's second start builds the same cache: leave the file alone (replacing
        # a file by rename makes ext4 flush the new one, milliseconds on every start).
        if read_at(etc, "ld.so.cache", len(cache)) != cache:
            write_at(etc, "ld.so.cache", cache)
    except OSError as e:
        raise HookError(f"cannot install /etc/ld.so.cache in the container: {e.strerror or e}") from None
    finally:
        os.close(etc)


def check(root: Root) -> None:
    """Before anything is written: the folder ``write_config`` writes in can be reached or
    made (not a file, not a loop), so a cache refresh that would fail changes no link."""
    try:
        fd = root.probe(CONF_DIR)
    except OSError as e:
        raise HookError(f"cannot reach {CONF_DIR} in the container: {e.strerror or e}") from None
    if fd is not None:
        os.close(fd)


def update(root: Root, folders: list[str], exe_fds: list[int], timeout: float) -> None:
    from .sandbox import run_ldconfig           # ctypes and friends: only when needed
    if folders:
        write_config(root, folders)
    install_cache(root, run_ldconfig(root.fd, exe_fds, folders, timeout))


def _dir(root: Root, path: str) -> int:
    try:
        return root.opendir(path, create=True)
    except OSError as e:
        raise HookError(f"cannot reach {path} in the container: {e.strerror or e}") from None
