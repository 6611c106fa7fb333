"""Apply a MigPlan all or nothing: checkpoint, journal, steps, verify, capability nodes.

On any failure (an NVML error, a GPU in use, a failed reset, a hook, an interrupt) the
node is restored to the checkpoint before the error is reported, and the error says what
failed and what the rollback did. A crash leaves the journal for ``recovery.recover``.
The caller holds the node lock.

``on_layout_changed(host)`` is called after every change of the node's MIG layout
(applied, rolled back), still under the node lock (which is re-entrant), so a CDI
refresh wired in there sees the final layout before anyone else can change it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ..devices.records import Inventory
from ..errors import HostagentError, StateError
from ..hostroot import HostRoot
from .capnodes import CapNodeChange, sync_cap_nodes
from .journal import ROLLING_BACK, Journal
from .plan import MigPlan
from .recovery import restore
from .runner import InUse, Progress, RunReport, quiet, run_plan, verify

__all__ = ["execute", "ApplyReport", "MigApplyError", "MigInUse", "MigInterrupted", "no_hook"]


class MigApplyError(StateError):
    code = "mig_apply_failed"


class MigInUse(MigApplyError):
    """Processes use an instance the apply had to destroy (or a GPU it had to switch): the
    details name the devices and the processes (pid, name), as the API promises."""
    code = "in_use"


class MigInterrupted(MigApplyError):
    """SIGTERM (systemd's start timeout) or Ctrl-C, or the daemon stopping: rolled back, and
    the message says how the rollback ended."""
    code = "mig_apply_interrupted"
    exit_code = 130


def no_hook(host: HostRoot) -> None:
    pass


@dataclass
class ApplyReport:
    plan: MigPlan
    run: RunReport = field(default_factory=RunReport)
    nodes: CapNodeChange = field(default_factory=CapNodeChange)


def _describe(e: BaseException) -> str:
    if isinstance(e, HostagentError):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return f"{type(e).__name__}: {e}"


def _with_uuids(details: dict, inventory: Inventory) -> dict:
    """Each busy device with its UUID (the MIG device's, or the GPU's for a whole GPU)."""
    uuids = {}
    for g in inventory.gpus:
        uuids[(g.index, None, None)] = g.uuid
        for d in (g.mig.devices if g.mig else ()):
            uuids[(g.index, d.gi, d.ci)] = d.uuid
    return {**details, "devices": [
        {"uuid": uuids.get((d["gpu"], d["gpu_instance"], d["compute_instance"])), **d}
        for d in details["devices"]]}


def _roll_back(host: HostRoot, journal: Journal, why: str, progress: Progress,
               on_layout_changed) -> str:
    journal.mark(ROLLING_BACK, why)
    progress(None, f"failed: {why}; rolling back")
    try:
        report = restore(host, journal.record, progress=progress)
    except BaseException as e:
        on_layout_changed(host)      # part of the rollback may have happened: publish what is there
        return (f"rolling back failed too ({_describe(e)}); the journal {Journal.path(host)} is kept "
                "and the next 'hostagent mig' command retries the rollback")
    journal.finish()
    on_layout_changed(host)
    return f"rolled back to the previous layout ({len(report.steps)} steps)"


def _interruptible(progress: Progress, stop_requested: Callable[[], bool]) -> Progress:
    """``progress`` that raises KeyboardInterrupt once a stop is requested: the run reports
    each GPU's change and each reset before it makes it, so the apply stops there and rolls
    back. Only the forward run gets it: a rollback is never interrupted."""
    def report(gpu, message) -> None:
        if stop_requested():
            raise KeyboardInterrupt
        progress(gpu, message)
    return report


def execute(host: HostRoot, inventory: Inventory, plan: MigPlan, *, skip_reset: bool = False,
            force: bool = False, before_phase: Callable[[str], None] = lambda phase: None,
            progress: Progress = quiet,
            on_layout_changed: Callable[[HostRoot], None] = no_hook,
            replan: Callable[[Inventory], MigPlan] | None = None,
            stop_requested: Callable[[], bool] | None = None) -> ApplyReport:
    """Apply ``plan`` (made from ``inventory``, read under the same lock). GPUs whose layout
    the plan defers (profiles listed only while MIG is enabled) are planned by
    ``replan(inventory)`` after the mode change and applied in the same transaction. Once
    ``stop_requested()`` is true the apply stops before its next GPU's change (or reset)
    and rolls back (MigInterrupted), as Ctrl-C does."""
    report = ApplyReport(plan)
    if not plan.changed:
        return report
    forward = _interruptible(progress, stop_requested) if stop_requested else progress
    phases_run: set[str] = set()

    def phase_once(phase: str) -> None:          # the second pass must not rerun a hook
        if phase not in phases_run:
            phases_run.add(phase)
            before_phase(phase)
    journal = Journal.begin(host, inventory, plan, skip_reset=skip_reset)
    try:
        run_plan(host, plan, report.run, skip_reset=skip_reset, force=force,
                 before_phase=phase_once, progress=forward)
        checked = verify(host, journal.record.after, journal.record.indices)
        if plan.deferred:
            checked = _apply_deferred(host, plan, replan(checked), journal, report, skip_reset=skip_reset,
                                      force=force, before_phase=phase_once, progress=forward)
        # Before the journal goes: a crash here is finished by recovery, nodes included.
        report.nodes = sync_cap_nodes(host, checked)
    except BaseException as e:
        why = _describe(e)
        outcome = _roll_back(host, journal, why, progress, on_layout_changed)
        done = f"after {len(report.run.steps)} of {sum(len(g.steps) for g in report.plan.changed)} steps"
        if isinstance(e, KeyboardInterrupt):
            raise MigInterrupted(f"applying '{plan.config}' was interrupted {done}; {outcome}") from None
        if isinstance(e, InUse):
            raise MigInUse(f"applying '{plan.config}' failed {done}: {why}; {outcome}",
                           **_with_uuids(e.details, inventory)) from None
        raise MigApplyError(f"applying '{plan.config}' failed {done}: {why}; {outcome}") from None
    journal.finish()
    on_layout_changed(host)
    return report


def _apply_deferred(host: HostRoot, plan: MigPlan, second: MigPlan, journal: Journal, report: ApplyReport,
                    **run) -> Inventory:
    """The second pass: the deferred GPUs' instances, planned now that MIG is enabled (and
    any GPU the first plan left out); GPUs the first pass settled are not touched again."""
    settled = {g.uuid for g in plan.gpus if not g.deferred}
    second = replace(second, gpus=tuple(g for g in second.gpus if g.uuid not in settled))
    if second.deferred or any(g.mode_steps or g.reset for g in second.gpus):
        raise StateError("GPU " + ", ".join(str(g.index) for g in second.gpus if g.mode_steps or g.deferred)
                         + ": MIG mode is not as planned after the mode change")
    report.plan = plan.then(second)
    journal.retarget(second)
    run_plan(host, second, report.run, **run)
    return verify(host, journal.record.after, journal.record.indices)
