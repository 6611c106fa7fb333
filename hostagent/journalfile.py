"""A long operation's journal: one JSON file in a folder of the state directory, written
atomically and durably (mode 0600) at each change, present only while the operation runs,
so a crash at any point leaves a record the next run resumes or rolls back.

A journal class names its folder, says what it is and how to recover in an error, and
turns its record into JSON and back (``from_json`` raises ValueError, KeyError or
TypeError for a record it cannot read).
"""

from __future__ import annotations

import json
import time

from .errors import StateError
from .fileio import remove, write_atomic
from .hostroot import HostRoot

__all__ = ["JournalFile", "stamp"]


def stamp() -> str:
    """The local time, as journals and checkpoints record it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class JournalFile:
    folder = ""           # under the state directory
    what = "the journal"  # in errors: "the MIG journal"
    hint = ""             # what to do with a journal that cannot be read

    def __init__(self, host: HostRoot, record):
        self.host = host
        self.record = record

    @classmethod
    def directory(cls, host: HostRoot):
        return host.state_dir / cls.folder

    @classmethod
    def path(cls, host: HostRoot):
        return cls.directory(host) / "journal.json"

    @classmethod
    def load(cls, host: HostRoot):
        """The journal of an operation that did not finish, or None."""
        path = cls.path(host)
        try:
            return cls(host, cls.from_json(json.loads(path.read_text())))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            raise StateError(f"{cls.what} cannot be read ({e})", where=str(path), hint=cls.hint) from None

    @classmethod
    def read_beside(cls, host: HostRoot, name: str) -> dict | None:
        """Another record of the folder (a history, a checkpoint); None if absent or unreadable."""
        try:
            return json.loads((cls.directory(host) / name).read_text())
        except (FileNotFoundError, ValueError):
            return None

    @staticmethod
    def from_json(raw: dict):
        return raw

    def to_json(self) -> dict:
        return self.record

    def _write(self) -> None:
        write_atomic(self.path(self.host), json.dumps(self.to_json(), indent=1), mode=0o600)

    def finish(self) -> None:
        """The operation is over: the journal goes."""
        remove(self.path(self.host))
