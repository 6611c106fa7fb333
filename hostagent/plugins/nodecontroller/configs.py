"""The files named on the command line: a mig-parted file (``--mig-config``) and a folder of
named sharing configs (``--sharing-configs``), as a ConfigMap mounted as a volume lays them
out: one file per key, behind symlinks into a ``..data`` folder the kubelet swaps in one
rename when the ConfigMap changes.

They are read again when they change (``Watched``: each file's real path, inode, size and
modification time; a local ``stat``, nothing asked of the API server). A file that cannot
be read or parsed is a ``problem``: one line naming it and what is wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import HostagentError

__all__ = ["config_names", "Watched", "MigFile", "read_mig_file", "read_sharing_config"]


def config_names(folder: Path) -> dict[str, Path]:
    """Name -> file of each named config in ``folder``: its regular files (symlinks to one
    too), without a ConfigMap volume's own entries (``..data``, ``..2024_...``) and hidden
    files."""
    out = {}
    for entry in sorted(os.listdir(folder)):
        path = folder / entry
        if not entry.startswith(".") and path.is_file():
            out[entry] = path
    return out


def _signature(path: Path):
    try:
        st = os.stat(path)
        return (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError as e:
        return (str(path), e.errno)


class Watched:
    """Whether a file, or a folder's files, changed since the last look."""

    def __init__(self, path: Path | None, folder: bool = False):
        self.path = path
        self.folder = folder
        self._last = None

    def signature(self):
        if self.path is None:
            return None
        if not self.folder:
            return _signature(self.path)
        try:
            names = config_names(self.path)
        except OSError as e:
            return (str(self.path), e.errno)
        return tuple((name, _signature(p)) for name, p in names.items())

    def changed(self) -> bool:
        now = self.signature()
        changed, self._last = now != self._last, now
        return changed


@dataclass(frozen=True)
class MigFile:
    """``--mig-config`` as last read: its spec, or why it cannot be used."""
    path: Path | None
    spec: object = None                 # mig.spec.MigSpec
    problem: str | None = None

    @property
    def names(self) -> list[str]:
        return sorted(self.spec.configs) if self.spec is not None else []

    def document(self) -> dict | None:
        """The spec to send to the agent (None: the agent's own configs)."""
        return self.spec.to_dict() if self.spec is not None else None


def read_mig_file(path: Path | None) -> MigFile:
    if path is None:
        return MigFile(None)
    from ...mig.spec import load_spec
    try:
        spec = load_spec(str(path))
    except HostagentError as e:
        return MigFile(path, problem=e.message)
    if not spec.configs:
        return MigFile(path, problem=f"{path}: the file has no MIG configs (add them under 'mig-configs')")
    return MigFile(path, spec)


def read_sharing_config(path: Path):
    """(SharingConfig, None) or (None, the problem)."""
    from ...sharing.config import load_file
    try:
        return load_file(str(path)), None
    except HostagentError as e:
        return None, e.message
