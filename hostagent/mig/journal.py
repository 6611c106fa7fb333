"""The checkpoint and the journal of a MIG apply, in ``<state dir>/mig``.

``checkpoint.json`` holds every MIG GPU's exact layout (mode and placements) taken before
anything changes; it stays after a successful apply as the record of the previous layout.
``journal.json`` exists only while an apply runs: the GPUs it changes with their layouts
before and after, and its status. Recovery needs nothing else because it compares the
node's actual state with those two layouts (it never replays steps), so the journal is
rewritten only when the status changes. Both are written atomically and durably.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..devices.records import Inventory
from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot
from ..journalfile import JournalFile, stamp as _stamp
from .layout import Layout
from .plan import MigPlan

__all__ = ["Journal", "JournalRecord", "mig_state_dir", "read_checkpoint", "APPLYING", "ROLLING_BACK"]

APPLYING, ROLLING_BACK = "applying", "rolling-back"
VERSION = 1


def mig_state_dir(host: HostRoot):
    return Journal.directory(host)


@dataclass(frozen=True)
class JournalRecord:
    config: str
    status: str
    started: str
    pid: int
    skip_reset: bool
    before: dict[str, Layout]        # by GPU UUID
    after: dict[str, Layout]
    indices: dict[str, int]
    error: str | None = None
    # ``after`` is only the mode change; the layout is planned once MIG is enabled. Until
    # then a crash is always rolled back: the node reaching ``after`` is not the end.
    replan: bool = False

    def to_dict(self) -> dict:
        return {"version": VERSION, "config": self.config, "status": self.status,
                "started": self.started, "pid": self.pid, "skip_reset": self.skip_reset,
                "error": self.error, "replan": self.replan,
                "gpus": {u: {"index": self.indices[u], "before": self.before[u].to_dict(),
                             "after": self.after[u].to_dict()} for u in self.before}}

    @classmethod
    def from_dict(cls, raw: dict) -> "JournalRecord":
        if raw.get("version") != VERSION:
            raise ValueError(f"unknown journal version {raw.get('version')!r}")
        gpus = raw["gpus"]
        return cls(config=raw["config"], status=raw["status"], started=raw["started"],
                   pid=raw["pid"], skip_reset=raw["skip_reset"], error=raw.get("error"),
                   replan=raw.get("replan", False),
                   before={u: Layout.from_dict(g["before"]) for u, g in gpus.items()},
                   after={u: Layout.from_dict(g["after"]) for u, g in gpus.items()},
                   indices={u: g["index"] for u, g in gpus.items()})


class Journal(JournalFile):
    folder = "mig"
    what = "the MIG journal"
    hint = "inspect it, restore the layout by hand from checkpoint.json, then remove the journal"
    from_json = staticmethod(JournalRecord.from_dict)

    def to_json(self) -> dict:
        return self.record.to_dict()

    @classmethod
    def begin(cls, host: HostRoot, inventory: Inventory, plan: MigPlan, *, skip_reset: bool) -> "Journal":
        """Write the checkpoint, then the journal; only then may anything change."""
        directory = ensure_dir(mig_state_dir(host), 0o700)
        checkpoint = {"version": "v1", "created": _stamp(), "config": plan.config,
                      "gpus": {g.uuid: {"index": g.index, **Layout.of(g).to_dict()}
                               for g in inventory.gpus if g.mig is not None}}
        write_atomic(directory / "checkpoint.json", json.dumps(checkpoint, indent=1), mode=0o600)
        changed = plan.changed
        record = JournalRecord(config=plan.config, status=APPLYING, started=_stamp(), pid=os.getpid(),
                               skip_reset=skip_reset, before={g.uuid: g.before for g in changed},
                               after={g.uuid: g.after for g in changed},
                               indices={g.uuid: g.index for g in changed},
                               replan=bool(plan.deferred))
        journal = cls(host, record)
        journal._write()
        return journal

    def retarget(self, second: MigPlan) -> None:
        """The layouts planned after the mode change replace ``after``; ``before`` (what a
        rollback restores) stays the layout from before the whole apply."""
        from dataclasses import replace
        r = self.record
        self.record = replace(r, replan=False,
                              before={**{g.uuid: g.before for g in second.changed}, **r.before},
                              after={**r.after, **{g.uuid: g.after for g in second.changed}},
                              indices={**r.indices, **{g.uuid: g.index for g in second.changed}})
        self._write()

    def mark(self, status: str, error: str | None = None) -> None:
        from dataclasses import replace
        self.record = replace(self.record, status=status, error=error or self.record.error)
        self._write()


def read_checkpoint(host: HostRoot) -> dict | None:
    return Journal.read_beside(host, "checkpoint.json")
