"""The real host's hostagent folders, listed so a test run can prove it left them alone.

Tests run against simulated roots and temporary folders; a command that slips through to
the host's own paths (a node lock, a config cache, a CDI spec) shows up as a difference
between the listings taken before and after the run.
"""

from __future__ import annotations

import os
import stat

__all__ = ["HOST_DIRS", "listing", "changes"]

HOST_DIRS = ("/run/hostagent", "/etc/cdi", "/var/run/cdi", "/etc/hostagent", "/run/nvidia/validations")


def _entry(path: str) -> tuple:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        return ("dir",)            # its entries are listed themselves
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    return ("file", st.st_size, st.st_mtime_ns)     # a taken lock rewrites its file


def listing(dirs=HOST_DIRS) -> dict[str, tuple]:
    """Every path under ``dirs`` (the folders included), with what a change would alter."""
    out: dict[str, tuple] = {}
    for top in dirs:
        if not os.path.lexists(top):
            continue
        out[top] = _entry(top)
        for folder, subdirs, files in os.walk(top, onerror=lambda e: out.update({e.filename: ("unreadable",)})):
            for name in subdirs + files:
                path = os.path.join(folder, name)
                try:
                    out[path] = _entry(path)
                except FileNotFoundError:
                    pass           # removed while listed
    return out


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """One line per path added, changed or removed between two listings."""
    lines = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"changed {p}" for p in sorted(after.keys() & before.keys()) if after[p] != before[p]]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    return lines
