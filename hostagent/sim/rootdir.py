"""Where a simulated node may be built, and replacing one.

A node's root is a whole host tree, so building one writes dev/, proc/, usr/lib/... into
it: only a new or empty directory, or one that already holds a simulated node (replaced on
request), is accepted. Clearing happens only under the node's own marker (``.sim``), never
across a mount point, so no other directory is ever emptied.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import HostagentError, StateError, UsageError
from .store import SimStore

__all__ = ["check_root", "build_node", "clear_node", "ENGINE_DIRS"]

# The folders an installed engine has (its configuration folder; its main file may be
# missing, as engines run with their defaults then), and where the runtime shim goes.
ENGINE_DIRS = {"containerd": ("etc/containerd",), "crio": ("etc/crio",), "docker": ("etc/docker",)}
SHIM_DIR = "usr/local/sbin"

# Kernel file systems: nothing can be built there, and the error would not say why.
_PSEUDO = (Path("/proc"), Path("/sys"), Path("/dev"))
_NEW_ROOT_HINT = "choose a new or empty directory"


def check_root(text: str) -> Path:
    """The absolute root a node may be built in; UsageError for a path that cannot be one."""
    if not text or not text.strip():
        raise UsageError("no directory given for the simulated node",
                         hint="pass one, e.g. --root /tmp/h100")
    path = Path(text).absolute()
    if path == Path("/"):
        raise UsageError("the host's own root cannot hold a simulated node", where=str(path),
                         hint=_NEW_ROOT_HINT)
    real = Path(os.path.realpath(path))
    if any(real == p or p in real.parents for p in _PSEUDO):
        raise UsageError("a kernel file system cannot hold a simulated node", where=str(path),
                         hint=_NEW_ROOT_HINT)
    existing = path
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        what = "not a directory" if existing == path else f"{existing} is not a directory"
        raise UsageError(what, where=str(path), hint=_NEW_ROOT_HINT)
    return path


def _stop_holders(store: SimStore) -> None:
    """Stop the holder processes the old node started (best effort: its state may be bad)."""
    from .control import stop_spawned
    try:
        stop_spawned(store.read().processes)
    except (HostagentError, OSError, ValueError):
        pass


def _check_one_file_system(root: Path) -> None:
    device = root.stat().st_dev
    for directory, subdirs, _ in os.walk(root):
        for name in subdirs:
            sub = Path(directory, name)
            if not sub.is_symlink() and sub.stat().st_dev != device:
                raise StateError("a file system is mounted inside the simulated node", where=str(sub),
                                 hint="unmount it before replacing the node")


def clear_node(root: Path) -> None:
    """Remove everything under ``root``, which must hold a simulated node."""
    store = SimStore(root)
    if not store.exists():
        raise StateError("not a simulated node (no .sim/node.json), so it is not cleared",
                         where=str(root), hint=_NEW_ROOT_HINT)
    _check_one_file_system(root)
    _stop_holders(store)
    _empty(root)


def _empty(root: Path) -> None:
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _has_entries(directory: Path) -> bool:
    with os.scandir(directory) as entries:
        return any(entries)


def build_node(text: str, profile: str, *, replace: bool = False, engines=(),
               driver_version: str | None = None, distro: str | None = None) -> SimStore:
    """Build a simulated node of ``profile`` (with ``driver_version``'s driver, if given) in
    the directory ``text`` names, with the folders of the container ``engines`` named (see
    ENGINE_DIRS) and ``distro``'s distribution (default: ``packages.DEFAULT_DISTRO``).

    ``replace`` clears a simulated node already there first. A build that fails leaves
    the directory as it found it, except a node being replaced, which is gone.
    """
    from . import catalog, packages
    from .driverroot import create_node
    catalog.load_profile(profile)       # unknown profile, version or distribution: an error before touching anything
    if driver_version is not None:
        catalog.check_driver_version(driver_version)
    distro = packages.check_distro(distro or packages.DEFAULT_DISTRO).name
    root = check_root(text)
    new = root                    # the topmost directory this build creates, if any
    while not os.path.lexists(new.parent):
        new = new.parent
    created = not os.path.lexists(root)
    if not created:
        if SimStore(root).exists():
            if not replace:
                raise UsageError("a simulated node already exists there", where=str(root),
                                 hint="pass --force to replace it")
            clear_node(root)
        elif _has_entries(root):
            raise UsageError("the directory holds files but no simulated node", where=str(root),
                             hint=_NEW_ROOT_HINT)
    try:
        store = create_node(root, profile, driver_version=driver_version, distro=distro)
        folders = [d for e in engines for d in ENGINE_DIRS[e]] + ([SHIM_DIR] if engines else [])
        for folder in folders:
            (root / folder).mkdir(mode=0o755, parents=True, exist_ok=True)
        return store
    except BaseException as e:
        if created:
            shutil.rmtree(new, ignore_errors=True)
        elif root.is_dir():
            _empty(root)         # it was empty (or cleared): all of it is this build's
        if isinstance(e, OSError):
            raise StateError(f"cannot build the simulated node: {e.strerror or e}",
                             where=e.filename or str(root), hint=_NEW_ROOT_HINT) from None
        raise
