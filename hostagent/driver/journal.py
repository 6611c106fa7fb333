"""The driver installer's journal and history, in ``<state dir>/driver``.

``journal.json`` exists only while an install or rollback runs: its plan, the steps done,
the step under way, and its status (``running``, ``rolling-back``, ``failed``). It is written
atomically and durably before and after each step, so a run killed at any point leaves a
journal the next run resumes (the same version: the step under way and the rest run again;
each step is idempotent) or rolls back (``driver rollback``), and no driver command meets it
without saying so. ``history.json`` keeps what the last finished install put in place and
what it replaced: ``driver rollback`` restores that, and the next install releases the holds
it placed.
"""

from __future__ import annotations

import json
import os

from ..fileio import ensure_dir, pid_alive, write_atomic
from ..hostroot import HostRoot
from ..journalfile import JournalFile, stamp
from .plan import InstallPlan

__all__ = ["Journal", "read_history", "write_history", "driver_state_dir"]

VERSION = 1


def driver_state_dir(host: HostRoot):
    return Journal.directory(host)


class Journal(JournalFile):
    folder = "driver"
    what = "the driver journal"
    hint = "check the driver with 'hostagent driver verify', then remove the journal"

    @staticmethod
    def from_json(raw: dict) -> dict:
        if raw.get("version") != VERSION:
            raise ValueError(f"unknown journal version {raw.get('version')!r}")
        InstallPlan.from_dict(raw["plan"])
        return raw

    @classmethod
    def begin(cls, host: HostRoot, plan: InstallPlan) -> "Journal":
        ensure_dir(driver_state_dir(host), 0o700)
        journal = cls(host, {"version": VERSION, "plan": plan.to_dict(), "pid": os.getpid(),
                             "started": stamp(), "status": "running", "done": [], "current": None,
                             "rollback": None, "error": None})
        journal._write()
        return journal

    @property
    def plan(self) -> InstallPlan:
        return InstallPlan.from_dict(self.record["plan"])

    @property
    def rollback_plan(self) -> InstallPlan | None:
        raw = self.record.get("rollback")
        return InstallPlan.from_dict(raw) if raw else None

    @property
    def alive(self) -> bool:
        return self.record["pid"] != os.getpid() and pid_alive(self.record["pid"])

    def describe(self) -> str:
        plan, r = self.plan, self.record
        at = r["current"] or (r["done"][-1] if r["done"] else "the start")
        return (f"the driver {plan.operation} of {plan.version} (started {r['started']} by pid {r['pid']}, "
                f"status {r['status']}, at step {at})")

    def adopt(self) -> None:
        """This process carries on an interrupted run."""
        self.record["pid"] = os.getpid()
        self._write()

    def step(self, name: str, done: bool) -> None:
        if done:
            self.record["done"].append(name)
            self.record["current"] = None
        else:
            self.record["current"] = name
        self._write()

    def rolling_back(self, plan: InstallPlan, error: str) -> None:
        self.record.update(status="rolling-back", rollback=plan.to_dict(), error=error, done=[], current=None)
        self._write()

    def fail(self, error: str) -> None:
        self.record.update(status="failed", error=error)
        self._write()


def read_history(host: HostRoot) -> dict | None:
    return Journal.read_beside(host, "history.json")


def write_history(host: HostRoot, plan: InstallPlan, replaced: InstallPlan | None = None) -> None:
    """``plan`` is in place; ``replaced`` (an install's own plan) says what it replaced."""
    source = replaced or plan
    record = {"version": VERSION, "installed": stamp(), "driver_version": plan.version,
              "flavour": plan.flavour, "packages": [list(p) for p in plan.packages],
              "held": list(plan.hold), "previous_version": source.previous,
              "previous_packages": [list(p) for p in source.previous_packages]}
    ensure_dir(driver_state_dir(host), 0o700)
    write_atomic(driver_state_dir(host) / "history.json", json.dumps(record, indent=1), mode=0o600)
