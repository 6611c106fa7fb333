"""The journal of a sharing apply, in ``<state dir>/sharing/journal.json``: present only while
an apply changes the node, with the configuration before and after it.

The configuration in force (``/etc/hostagent/sharing.yaml``) is recorded only once an apply
succeeded, so an apply that fails, or is killed, leaves the one before recorded. A journal
left by a killed apply tells the next sharing command (or the agent's start) to bring the
node back to what is recorded: that rolls the apply back, or, if it was killed after
recording, finishes it.
"""

from __future__ import annotations

import os

from ..fileio import ensure_dir
from ..hostroot import HostRoot
from ..journalfile import JournalFile, stamp

__all__ = ["SharingJournal"]

VERSION = 1


class SharingJournal(JournalFile):
    folder = "sharing"
    what = "the sharing journal"
    hint = ("remove it: the next sharing command or agent start then brings the node to "
            "/etc/hostagent/sharing.yaml")

    @staticmethod
    def from_json(raw: dict) -> dict:
        if raw.get("version") != VERSION:
            raise ValueError(f"unknown journal version {raw.get('version')!r}")
        return raw

    @classmethod
    def begin(cls, host: HostRoot, before: dict | None, after: dict | None) -> "SharingJournal":
        """Recorded before the node changes: the configurations in force and applied (None: off)."""
        journal = cls(host, {"version": VERSION, "started": stamp(), "pid": os.getpid(),
                             "before": before, "after": after})
        ensure_dir(cls.directory(host), 0o700)
        journal._write()
        return journal

    def describe(self) -> str:
        return f"the sharing apply started {self.record['started']} by pid {self.record['pid']}"
