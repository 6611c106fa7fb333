"""Reading, diffing and writing engine configuration files: the imperative shell.

A write of several files is all or nothing, and never overwrites another admin's edit:

1. (by the caller, before this) what ``revert`` needs is recorded (``backups``);
2. every new text is written to a temporary file beside its target (a read-only or
   missing directory fails here, before any target changed);
3. right before each rename, the target is compared with what was read (existence,
   then size/mtime/inode, then content); any difference aborts the run and undoes the
   renames already done.
"""

from __future__ import annotations

import difflib
import glob
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, HostagentError, NotFoundError, StateError
from ..fileio import read_regular, remove_stale_temporaries, temp_path, write_point

__all__ = ["Snapshot", "Change", "Reader", "read_one", "changes", "check_directories", "diff", "write"]


@dataclass(frozen=True)
class Snapshot:
    path: str                 # as the engine knows it (host path)
    real: Path                # where it is under the host root
    text: str | None          # None: the file does not exist
    stamp: tuple | None       # (size, mtime_ns, inode) when read


@dataclass(frozen=True)
class Change:
    snapshot: Snapshot
    new: str | None           # None: remove the file
    make_parent: bool = False  # a missing parent directory may be created (drop-in folders)

    @property
    def path(self) -> str:
        return self.snapshot.path


def _stamp(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def read_one(host, path: str) -> Snapshot:
    real = host.host(path)
    try:
        data, st = read_regular(str(real))
    except FileNotFoundError:
        return Snapshot(path, real, None, None)
    except ValueError as e:               # a FIFO, a directory, a huge file: never read
        raise ConfigError(f"{e}; a configuration file must be a regular file", where=str(real)) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", where=str(real)) from None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ConfigError("is not UTF-8 text", where=str(real)) from None
    return Snapshot(path, real, text, _stamp(st))


class Reader:
    """Reads host files for an engine's plan, each once, keeping what was read (the
    snapshots the writes compare against)."""

    def __init__(self, host):
        self.host = host
        self.snapshots: dict[str, Snapshot] = {}

    def snapshot(self, path: str) -> Snapshot:
        if path not in self.snapshots:
            self.snapshots[path] = read_one(self.host, path)
        return self.snapshots[path]

    def text(self, path: str) -> str | None:
        """The file's text; None when it does not exist."""
        return self.snapshot(path).text

    def glob(self, pattern: str) -> list[str]:
        """Host paths of the regular files matching ``pattern``, sorted, names starting
        with a dot included (as Go's filepath.Glob, which containerd and CRI-O use)."""
        prefix = str(self.host.host("/"))
        out = []
        real_pattern = os.path.join(glob.escape(prefix), pattern.lstrip("/"))
        for real in glob.glob(real_pattern, include_hidden=True):
            if os.path.isfile(real):
                out.append(self.host.shown(real))
        return sorted(out)


def changes(snapshots: dict[str, Snapshot], rendered: dict[str, str | None], make_parent=()) -> list[Change]:
    """The rendered files whose text differs from what is there; the folders of the paths
    in ``make_parent`` may be created."""
    return [Change(snapshots[p], new, p in make_parent) for p, new in rendered.items() if snapshots[p].text != new]


def diff(items: list[Change]) -> str:
    out = []
    for c in items:
        old = (c.snapshot.text or "").splitlines(keepends=True)
        new = (c.new or "").splitlines(keepends=True)
        a = c.path if c.snapshot.text is not None else "/dev/null"
        b = c.path if c.new is not None else "/dev/null"
        out += difflib.unified_diff(old, new, a, b)
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
    return "".join(out)


def _check_unchanged(snap: Snapshot) -> None:
    """Refuse when the file is not what was read (another writer got there in between)."""
    try:
        st = os.stat(snap.real)
    except FileNotFoundError:
        if snap.text is None:
            return
        raise StateError("was removed while hostagent was editing it", where=str(snap.real),
                         hint="nothing was changed; run the command again") from None
    if snap.text is not None and _stamp(st) == snap.stamp:
        return
    current = read_one_text(snap.real)
    if current != snap.text:
        raise StateError("changed while hostagent was editing it (another admin or tool?)",
                         where=str(snap.real), hint="nothing was changed; run the command again")


def read_one_text(real: Path) -> str | None:
    try:
        return read_regular(str(real))[0].decode(errors="replace")
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise StateError(f"{e} now (was it replaced while hostagent was editing it?)", where=str(real),
                         hint="nothing was changed") from None


def check_directories(items: list[Change]) -> None:
    """Fail as ``write`` would on a missing directory, before anything is written: a dry
    run promises only what the real run does."""
    for c in items:
        folder = c.snapshot.real.parent
        if c.new is not None and not folder.is_dir() and not (c.make_parent and folder.parent.is_dir()):
            raise _no_directory(folder)


def _no_directory(folder: Path) -> NotFoundError:
    return NotFoundError("the directory does not exist", where=str(folder),
                         hint="is the engine installed? nothing was changed")


def _directory(real: Path, make: bool) -> Path:
    """The target's directory; a missing one is created only for a drop-in, and only when
    its parent exists (the engine's own folder missing means the engine is not there)."""
    folder = real.parent
    if folder.is_dir():
        return folder
    if make and folder.parent.is_dir():
        try:
            folder.mkdir(mode=0o755)
        except OSError as e:
            raise HostagentError(f"cannot create the directory: {e.strerror}", where=str(folder),
                                 hint="nothing was changed") from None
        return folder
    raise _no_directory(folder)


def _temp(real: Path, text: str, like: os.stat_result | None, make_parent: bool = False) -> str:
    """A temporary file beside ``real`` holding ``text``, with the mode and owner of
    ``like`` (the file it replaces), or 0644 for a new file."""
    mode = like.st_mode & 0o7777 if like else 0o644
    folder = _directory(real, make_parent)
    tmp = temp_path(str(folder), real.name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if like and (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
            os.chown(tmp, like.st_uid, like.st_gid)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise HostagentError(f"cannot write: {e.strerror}", where=str(folder),
                             hint="nothing was changed") from None
    return tmp


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(items: list[Change], *, before_rename=None) -> None:
    """Write ``items`` all or nothing (see the module docstring). ``before_rename`` runs
    after the temporary files exist (tests use it to race)."""
    temps: dict[str, str] = {}
    try:
        for c in items:
            if c.new is not None:
                like = os.stat(c.snapshot.real) if c.snapshot.text is not None else None
                temps[c.path] = _temp(c.snapshot.real, c.new, like, c.make_parent)
        if before_rename:
            before_rename()
        for c in items:
            if c.new is not None:
                write_point(c.snapshot.real.name)
        for c in items:
            _check_unchanged(c.snapshot)
        done: list[Change] = []
        try:
            for c in items:
                _check_unchanged(c.snapshot)     # again, right before this rename
                if c.new is None:
                    os.unlink(c.snapshot.real)
                else:
                    os.replace(temps.pop(c.path), c.snapshot.real)
                    remove_stale_temporaries(str(c.snapshot.real.parent), c.snapshot.real.name)
                done.append(c)
                _fsync_dir(c.snapshot.real.parent)
        except BaseException:
            for c in reversed(done):             # put back what this run replaced
                if c.snapshot.text is None:
                    os.unlink(c.snapshot.real)
                else:
                    tmp = _temp(c.snapshot.real, c.snapshot.text, os.stat(c.snapshot.real))
                    os.replace(tmp, c.snapshot.real)
            raise
    finally:
        for tmp in temps.values():
            try:
                os.unlink(tmp)
            except OSError:
                pass
