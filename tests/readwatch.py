"""Which files of a tree anyone opened or read, as the kernel reports it (inotify IN_OPEN and
IN_ACCESS on every directory of the tree, which cover the directory itself and the files in
it), whatever the file system does with access times (noatime, relatime, a read-only mount).
A path-only open (O_PATH) and a stat are not reads, and report nothing, as they change no
access time either.

    with ReadWatch(tree) as watch:
        ...                      # the run under test
        assert watch.reads() == []
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

__all__ = ["ReadWatch"]

IN_ACCESS, IN_OPEN, IN_ONLYDIR, IN_DONT_FOLLOW = 0x1, 0x20, 0x01000000, 0x02000000
IN_Q_OVERFLOW = 0x4000
_EVENT = struct.Struct("iIII")


class ReadWatch:
    def __init__(self, top: Path):
        self.top = Path(top)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs: dict[int, Path] = {}
        for folder in [self.top, *(p for p in self.top.rglob("*") if p.is_dir() and not p.is_symlink())]:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(folder), IN_ACCESS | IN_OPEN | IN_ONLYDIR
                                              | IN_DONT_FOLLOW)
            if wd < 0:
                raise OSError(ctypes.get_errno(), "inotify_add_watch", str(folder))
            self.dirs[wd] = folder
        self._seen: list[str] = []

    def reads(self) -> list[str]:
        """The paths read or opened since the watch began (a directory listed counts)."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            at = 0
            while at < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    self._seen.append("<events lost: too many reads to list>")
                elif wd in self.dirs:
                    path = self.dirs[wd] / os.fsdecode(name) if name else self.dirs[wd]
                    if str(path) not in self._seen:
                        self._seen.append(str(path))
        return list(self._seen)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "ReadWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
