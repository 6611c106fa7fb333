"""Back to a known layout: rollback after a failed apply, and recovery after a crash.

Both compare the node's actual state with the journal's layouts instead of replaying a
step log, so they work whatever step a crash interrupted (including after an NVML call
that succeeded but whose success was never recorded): a node already in the new layout
is finished, anything else is restored to the checkpoint.
"""

from __future__ import annotations

import time
from typing import Callable

from ..devices import read_inventory
from ..errors import HostagentError, StateError
from ..hostroot import HostRoot
from .capnodes import sync_cap_nodes
from .journal import APPLYING, ROLLING_BACK, Journal, JournalRecord
from .layout import Layout
from .planner import restore_plan
from .runner import Progress, RunReport, quiet, run_plan, transient, verify

__all__ = ["restore", "recover", "RecoveryError", "RETRY_SECONDS"]

# How long a rollback keeps retrying what is transient (a GPU or instance still held: the
# killed apply's process not yet reaped, a monitoring client letting go) before it gives up
# and leaves the journal for the next command.
RETRY_SECONDS = 30.0


class RecoveryError(StateError):
    code = "mig_recovery_failed"


def _restore_once(host: HostRoot, record: JournalRecord, progress: Progress) -> RunReport:
    inventory = read_inventory(host)
    plan = restore_plan(inventory, record.before, skip_reset=record.skip_reset,
                        label=f"rollback of {record.config}")
    report = RunReport()
    if plan.changed:
        run_plan(host, plan, report, skip_reset=record.skip_reset, progress=progress)
        inventory = verify(host, {g.uuid: g.after for g in plan.gpus}, {g.uuid: g.index for g in plan.gpus})
    sync_cap_nodes(host, inventory)
    return report


def restore(host: HostRoot, record: JournalRecord, *, progress: Progress = quiet,
            retry_seconds: float = RETRY_SECONDS) -> RunReport:
    """Put every GPU of the journal back to its checkpointed layout. Each attempt plans
    from the node as it is, so one that failed half-way is continued; what failed because
    something held a GPU is retried, with growing pauses, for ``retry_seconds``."""
    deadline = time.monotonic() + retry_seconds
    pause, attempts = 0.1, 0
    while True:
        attempts += 1
        try:
            return _restore_once(host, record, progress)
        except HostagentError as e:
            if not transient(e) or time.monotonic() + pause > deadline:
                if transient(e):
                    e.what += f" (still so after {attempts} attempts over {retry_seconds:g} s)"
                raise
            progress(None, f"{e.what}; retrying in {pause:.1f} s")
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def recover(host: HostRoot, *, progress: Progress = quiet,
            on_layout_changed: Callable[[HostRoot], None] = lambda host: None,
            retry_seconds: float = RETRY_SECONDS) -> str | None:
    """Finish or roll back an interrupted apply; the caller holds the node lock.
    Returns what was done, or None when there was nothing to recover."""
    journal = Journal.load(host)
    if journal is None:
        return None
    rec = journal.record
    who = f"the interrupted apply of '{rec.config}' (started {rec.started} by pid {rec.pid})"
    inventory = read_inventory(host)
    actual = {g.uuid: Layout.of(g) for g in inventory.gpus}
    if rec.status == APPLYING and not rec.replan and all(actual.get(u) == a for u, a in rec.after.items()):
        sync_cap_nodes(host, inventory)
        journal.finish()
        on_layout_changed(host)
        return f"completed {who}: the new layout was in place"
    journal.mark(ROLLING_BACK, rec.error or "interrupted")
    try:
        report = restore(host, rec, progress=progress, retry_seconds=retry_seconds)
    except HostagentError as e:
        on_layout_changed(host)      # part of the rollback may have happened: publish what is there
        raise RecoveryError(f"rolling back {who} failed: {e.message}", where=str(Journal.path(host)),
                            hint="the journal is kept; fix the cause and run any 'hostagent mig' "
                                 "command to retry") from None
    journal.finish()
    on_layout_changed(host)
    return f"rolled back {who} to the previous layout ({len(report.steps)} steps)"
