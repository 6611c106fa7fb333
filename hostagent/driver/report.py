"""A driver install's report: what ``hostagent driver install --report FILE`` keeps in FILE
while it runs and once it ended, for whoever started it and does not wait for it (the agent,
for ``POST /v1/driver/install``). Written atomically (mode 0600) at its start, at each
progress line and at its end, so a reader never sees half of one:

    {"version": "550.127.05", "state": "running", "process": {"pid", "start", "exe"},
     "started_at": 1700000000.0, "finished_at": null, "progress": "install: install the driver ...",
     "error": null, "outcome": null}

``state`` is ``starting`` (asked for, not running yet: the starter's own record), ``running``,
``succeeded``, ``rolled-back`` (the version did not work; the packages before it are back and
verify) or ``failed`` (refused before anything changed, or failed and not rolled back).
``judge`` adds ``interrupted``: a report still ``starting`` or ``running`` whose process is
gone. The driver journal then says where it stopped, and the same install resumes it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .. import processes
from ..fileio import write_atomic

__all__ = ["Report", "read", "judge", "FINAL", "STARTING_GRACE"]

FINAL = ("succeeded", "rolled-back", "failed")
# A report still ``starting`` this long after it was written names a process that never ran
# (a transient unit that did not start): interrupted.
STARTING_GRACE = 60.0


class Report:
    def __init__(self, path: str | os.PathLike, version: str):
        self.path = Path(path)
        self.record = {"version": version, "state": "running", "process": None, "started_at": round(time.time(), 3),
                       "finished_at": None, "progress": None, "error": None, "outcome": None}

    def _write(self) -> None:
        write_atomic(self.path, json.dumps(self.record, indent=1), mode=0o600)

    @classmethod
    def starting(cls, path, version: str) -> "Report":
        """The starter's record, written before it starts the installer, which replaces it
        with its own (so the starter never writes over the installer's)."""
        report = cls(path, version)
        report.record["state"] = "starting"
        report._write()
        return report

    def begin(self) -> None:
        self.record["process"] = processes.record(os.getpid()).to_dict()
        self._write()

    def progress(self, line: str) -> None:
        if not line.startswith(" "):          # a step, not one of its details
            self.record["progress"] = line
            self._write()

    def end(self, outcome: dict) -> None:
        state = "rolled-back" if outcome["rolled_back"] else "succeeded" if outcome["ok"] else "failed"
        self.record.update(state=state, finished_at=round(time.time(), 3), error=outcome["error"], outcome=outcome)
        self._write()

    def failed(self, message: str) -> None:
        self.record.update(state="failed", finished_at=round(time.time(), 3), error=message)
        self._write()


def read(path: str | os.PathLike) -> dict | None:
    """The report, or None when there is none (or it cannot be read: none was finished)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) and raw.get("state") else None


def judge(report: dict | None, now: float | None = None, alive=processes.current) -> dict | None:
    """The report as it stands: ``interrupted`` when it says its process runs and that
    process is gone (``alive(ProcessRecord)``)."""
    if report is None or report["state"] in FINAL:
        return report
    process = processes.ProcessRecord.from_dict(report.get("process"))
    if process is not None:
        running = alive(process)
    else:
        running = report["state"] == "starting" and (now or time.time()) - report["started_at"] < STARTING_GRACE
    return report if running else {**report, "state": "interrupted"}
