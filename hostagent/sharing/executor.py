"""Applies a sharing plan to the node: compute modes through NVML, time-slices through
``nvidia-smi compute-policy``, MPS daemons through ``mps``. Imperative shell of ``plan``.

Steps run in the plan's order; daemons start (and stop) in parallel, each on its own
device. A step that fails is reported and the others go on, except what depends on it (no
daemon starts on a GPU whose compute mode could not be set). The sharing state is saved
after every group of steps, so it always says what the node really has: an agent that
supervises the daemons retries what failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .. import faults
from ..errors import HostagentError, NotFoundError, StateError, permission_refused
from ..hostroot import HostRoot
from . import mps
from .config import INTERVALS
from .plan import SharingPlan, Step, daemon_settings
from .state import DaemonRecord, SharingState

__all__ = ["StepResult", "ApplyReport", "execute", "set_interval"]

PARALLEL = 8


@dataclass
class StepResult:
    step: Step
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    denied: bool = False            # refused for want of privilege (run as root)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        return {**self.step.to_dict(), "ok": self.ok, "error": self.error, "notes": self.notes,
                "denied": self.denied}


@dataclass
class ApplyReport:
    results: list[StepResult] = field(default_factory=list)

    @property
    def failed(self) -> list[StepResult]:
        return [r for r in self.results if not r.ok]

    def to_dict(self) -> dict:
        return {"results": [r.to_dict() for r in self.results], "failed": len(self.failed)}


def _failure(error: BaseException, text: str | None = None) -> tuple[str, bool]:
    """A step's error: its message, and whether it was refused for want of privilege."""
    return (text if text is not None else getattr(error, "message", str(error))), permission_refused(error)


def set_interval(host: HostRoot, uuid: str, interval: str) -> None:
    """``nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>``, as the DRA driver sets
    a GPU's time-slice (NVML has no call for it)."""
    tool = host.driver_command("nvidia-smi")
    if tool is None:
        raise NotFoundError("nvidia-smi is needed to set time-slices and was not found",
                            where=str(host.driver("usr/bin/nvidia-smi")),
                            hint="install the NVIDIA driver utilities, or leave 'interval' out")
    cmd = [*tool, "compute-policy", "-i", uuid, "--set-timeslice", str(INTERVALS.index(interval))]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StateError(f"cannot run {cmd[0]}: {e}") from None
    if done.returncode != 0:
        out = " ".join((done.stdout + done.stderr).split()) or "no output"
        raise StateError(f"GPU {uuid}: time-slice {interval} not set (nvidia-smi exit {done.returncode}: {out})")


def _modes(host: HostRoot, steps: list[Step], state: SharingState) -> dict[str, tuple[str, bool]]:
    """Compute mode steps; errors by GPU uuid."""
    from ..devices import nvml_session
    from ..devices.computectl import ComputeControl
    errors = {}
    if not steps:
        return errors
    with nvml_session(host):
        ctl = ComputeControl()
        for s in steps:
            try:
                ctl.set_mode(s.target, s.detail["to"])
            except HostagentError as e:
                errors[s.target] = _failure(e)
                continue
            if s.action == "restore_compute_mode":
                state.saved_modes.pop(s.target, None)
            else:
                state.saved_modes.setdefault(s.target, s.detail["from"])
    return errors


def _intervals(host: HostRoot, steps: list[Step], state: SharingState) -> dict[str, tuple[str, bool]]:
    errors = {}
    for s in steps:
        to = "Default" if s.action == "restore_interval" else s.detail["to"]
        try:
            set_interval(host, s.target, to)
        except HostagentError as e:
            errors[s.target] = _failure(e)
            continue
        if to == "Default":
            state.intervals.pop(s.target, None)
        else:
            state.intervals[s.target] = to
    return errors


def _parallel(fn, steps: list[Step]) -> dict[str, tuple[tuple[str, bool] | None, object]]:
    """``fn(step)`` for each step at once; uuid -> (error, value)."""
    def run(step):
        try:
            return step.target, (None, fn(step))
        except HostagentError as e:
            return step.target, (_failure(e), None)
        except OSError as e:             # a directory or program the step could not use
            return step.target, (_failure(e, f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")), None)
    if not steps:
        return {}
    with ThreadPoolExecutor(min(PARALLEL, len(steps)), thread_name_prefix="hostagent-mps") as pool:
        return dict(pool.map(run, steps))


def execute(host: HostRoot, plan: SharingPlan, state: SharingState, *, interpreter: str = sys.executable,
            import_path: str | None = None) -> ApplyReport:
    """Apply ``plan`` and record it in ``state`` (saved as it goes)."""
    by_action: dict[str, list[Step]] = {}
    for s in plan.steps:
        by_action.setdefault(s.action, []).append(s)
    errors: dict[tuple[str, str], tuple[str, bool]] = {}      # (action, uuid) -> (message, denied)
    notes: dict[tuple[str, str], list[str]] = {}

    def stopped(step):
        record = state.daemons.get(step.target)
        mps.stop(host, step.target, record.known if record else None)
    for uuid, (error, _) in _parallel(stopped, by_action.get("stop_daemon", [])).items():
        if error:
            errors[("stop_daemon", uuid)] = error
        else:
            state.daemons.pop(uuid, None)
    if "stop_daemon" in by_action and not plan.desired.daemons and not mps.find_daemons(host):
        try:
            mps.unmount_shm(host)
        except HostagentError as e:      # the daemons are gone all the same: say so
            last = by_action["stop_daemon"][-1]
            notes[("stop_daemon", last.target)] = [f"note: {e.message}"]
    state.save(host)
    faults.point("sharing:after_stops")

    for action, fn in (("restore_interval", _intervals), ("restore_compute_mode", _modes),
                       ("set_compute_mode", _modes), ("set_interval", _intervals)):
        for uuid, error in fn(host, by_action.get(action, []), state).items():
            errors[(action, uuid)] = error
        state.save(host)

    bad_gpus = {uuid for (action, uuid) in errors if action == "set_compute_mode"}

    def started(step):
        d = plan.desired.devices[step.target]
        if d.gpu_uuid in bad_gpus:
            raise StateError(f"not started: the compute mode of GPU {d.gpu_index} could not be set")
        record = state.daemons.get(step.target)
        process, said = mps.start(host, step.target, daemon_settings(d), interpreter, import_path,
                                  adopt=not step.detail.get("restart"), known=record.known if record else None)
        notes[("start_daemon", step.target)] = said
        return process
    for uuid, (error, process) in _parallel(started, by_action.get("start_daemon", [])).items():
        if error:
            errors[("start_daemon", uuid)] = error
            continue
        before = state.daemons.get(uuid)
        state.daemons[uuid] = DaemonRecord(uuid, process.pid, time.time(), daemon_settings(plan.desired.devices[uuid]),
                                           before.restarts + 1 if before else 0, process.to_dict())
    for step in by_action.get("configure_daemon", []):
        try:
            mps.configure(host, step.target, daemon_settings(plan.desired.devices[step.target]))
            state.daemons[step.target].settings = daemon_settings(plan.desired.devices[step.target])
        except HostagentError as e:
            errors[("configure_daemon", step.target)] = _failure(e)
    state.devices = dict(plan.desired.devices)
    state.save(host)
    results = []
    for s in plan.steps:
        error, denied = errors.get((s.action, s.target), (None, False))
        results.append(StepResult(s, error, notes.get((s.action, s.target), []), denied))
    return ApplyReport(results)
