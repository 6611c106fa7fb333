"""Carry out a MigPlan's steps through NVML, phase by phase, as mig-parted orders them:
mode changes on every GPU that needs one, one reset of the Ampere GPUs left pending, then
the instance changes. No transaction logic here: ``executor`` wraps this in a checkpoint,
journal and rollback, and ``recovery`` uses it to restore.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from ..devices import nvml_session, read_inventory
from ..devices.migctl import NVML_IN_USE, NVML_RESET_REQUIRED, MigControl
from ..errors import ConflictError, StateError
from ..hostroot import HostRoot
from .layout import Layout
from .plan import CREATE_CI, CREATE_GI, DESTROY_CI, DESTROY_GI, SET_MODE, GpuPlan, MigPlan, Step
from .reset import reset_gpus

__all__ = ["RunReport", "run_plan", "refuse_busy", "verify", "Progress", "quiet", "InUse", "transient"]

log = logging.getLogger(__name__)

Progress = Callable[[int | None, str], None]
TERMINATE_WAIT = 10.0


def quiet(gpu: int | None, message: str) -> None:
    pass


@dataclass
class RunReport:
    steps: list[str] = field(default_factory=list)
    resets: list[int] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.steps or self.resets)


class InUse(ConflictError):
    """Processes use a GPU or MIG instance the plan must change; details name them."""
    code = "in_use"


def transient(error: Exception) -> bool:
    """Whether ``error`` may pass by itself: something held the GPU or instance (a process
    still exiting, a client that lets go), as opposed to a refusal that repeats."""
    details = getattr(error, "details", None) or {}
    code = getattr(error, "nvml_code", None) or details.get("nvml_code")
    return isinstance(error, InUse) or code == NVML_IN_USE or bool(details.get("in_use"))


def _name(pid: int) -> str | None:
    import psutil   # only applies that find busy instances pay for it
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None


def _names(busy: list) -> dict[int, str | None]:
    """Each busy process's name, looked up once per pid."""
    return {pid: _name(pid) for pid in {p.pid for p in busy}}


def _who(pid: int, names: dict[int, str | None]) -> str:
    return f"{pid} ({names[pid]})" if names[pid] else str(pid)


def _in_use(what: str, busy: list, hint: str) -> InUse:
    names = _names(busy)
    where = "; ".join(f"GPU {p.gpu}" + (f" GI {p.gi} CI {p.ci}" if p.gi is not None else "")
                      + f" by pid {_who(p.pid, names)}" for p in busy)
    return InUse(f"{what} in use: {where}", hint=hint,
                 devices=[dict(t) for t in dict.fromkeys(
                     (("gpu", p.gpu), ("gpu_instance", p.gi), ("compute_instance", p.ci)) for p in busy)],
                 processes=[{"pid": p.pid, "name": names[p.pid], "gpu": p.gpu, "gpu_instance": p.gi,
                             "compute_instance": p.ci} for p in busy])


def _terminate(pids: list[int]) -> None:
    import psutil
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=TERMINATE_WAIT)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=TERMINATE_WAIT)


def _busy(ctl: MigControl, targets: dict[int, set | None]) -> list:
    """Processes in the way: anywhere on a GPU (None), or in the (gi, ci) / (gi, None) given."""
    out = []
    for index, which in targets.items():
        for p in ctl.processes(index):
            if which is None or (p.gi, p.ci) in which or (p.gi, None) in which:
                out.append(p)
    return out


def _ensure_idle(ctl: MigControl, targets: dict[int, set | None], what: str, *, force: bool,
                 report: RunReport, progress: Progress) -> None:
    busy = _busy(ctl, targets)
    if not busy:
        return
    if not force:
        raise _in_use(what, busy, "stop those processes, or pass --force to terminate them")
    names = _names(busy)
    who = [_who(p.pid, names) for p in busy]
    progress(None, f"terminating processes in the way (--force): {', '.join(who)}")
    report.terminated += who
    _terminate(sorted({p.pid for p in busy}))
    still = _busy(ctl, targets)
    if still:
        raise _in_use(f"{what} still", still, "they outlived SIGTERM and SIGKILL; stop them by hand")


def _do(ctl: MigControl, step: Step, created: dict, report: RunReport):
    out = None
    if step.action == DESTROY_CI:
        ctl.destroy_compute_instance(step.gpu, step.gi_id, step.ci_id)
    elif step.action == DESTROY_GI:
        ctl.destroy_gpu_instance(step.gpu, step.gi_id)
    elif step.action == SET_MODE:
        out = ctl.set_mode(step.gpu, step.enabled)
    elif step.action == CREATE_GI:
        gi = step.gi
        created[gi.key] = ctl.create_gpu_instance(step.gpu, gi.profile_id, gi.start, gi.size)
    elif step.action == CREATE_CI:
        gi_id = step.gi_id if step.gi_id is not None else created[step.gi.key]
        ctl.create_compute_instance(step.gpu, gi_id, step.ci.profile_id, step.ci.start, step.ci.slices)
    report.steps.append(f"GPU {step.gpu}: {step.describe()}")
    log.debug("GPU %d: %s", step.gpu, step.describe())
    return out


def _mode_error(g: GpuPlan, current: bool, pending: bool, status) -> StateError:
    now = f"now {'enabled' if current else 'disabled'}" + (
        f", pending {'enabled' if pending else 'disabled'}" if current != pending else "")
    if status == NVML_RESET_REQUIRED:
        return StateError(f"GPU {g.index}: the MIG mode change needs a reboot (activation status "
                          f"RESET_REQUIRED, as in VM passthrough; {now})",
                          hint="apply with --mode-only --skip-reset, reboot, then apply again")
    if status == NVML_IN_USE:
        return StateError(f"GPU {g.index}: the MIG mode change did not take effect: the GPU is in "
                          f"use (activation status IN_USE; {now})", nvml_code=NVML_IN_USE,
                          hint="stop GPU clients (CUDA processes, nvidia-persistenced, DCGM, "
                               "nvidia_drm) and retry")
    return StateError(f"GPU {g.index}: MIG mode did not change as planned ({now})")


def _mode_phase(host: HostRoot, ctl: MigControl, gpus: list[GpuPlan], *, skip_reset: bool,
                report: RunReport, progress: Progress) -> None:
    status = {}
    for g in gpus:
        destroys = sum(s.action != SET_MODE for s in g.mode_steps)
        progress(g.index, ("enable" if g.after.pending else "disable") + " MIG mode"
                 + (f" (destroying {destroys} instances)" if destroys else ""))
        for step in g.mode_steps:
            result = _do(ctl, step, {}, report)
            if step.action == SET_MODE:
                status[g.index] = result
    to_reset = []
    for g in gpus:
        current, pending = ctl.mode(g.index)
        if Layout(g.after.enabled, g.after.pending).reached_by(Layout(current, pending)):
            continue                     # as planned, or already switched: no reset needed
        if g.reset and not skip_reset and status.get(g.index) != NVML_RESET_REQUIRED:
            to_reset.append(g)           # Ampere: the pending mode waits for a reset
            continue
        raise _mode_error(g, current, pending, status.get(g.index))
    if to_reset:
        progress(None, "resetting GPU " + ", ".join(f"{g.index} ({g.pci_bus_id})" for g in to_reset))
        reset_gpus(host, [g.pci_bus_id for g in to_reset])
        report.resets += [g.index for g in to_reset]
        for g in to_reset:
            current, pending = ctl.mode(g.index)
            if (current, pending) != (g.after.enabled, g.after.pending):
                raise _mode_error(g, current, pending, status.get(g.index))


def _config_phase(ctl: MigControl, gpus: list[GpuPlan], *, report: RunReport,
                  progress: Progress) -> None:
    for g in gpus:
        progress(g.index, ", ".join(
            f"{verb} {n} {kind}" for verb, kind, action in
            (("destroy", "CI", DESTROY_CI), ("destroy", "GI", DESTROY_GI),
             ("create", "GI", CREATE_GI), ("create", "CI", CREATE_CI))
            if (n := sum(s.action == action for s in g.config_steps))))
        created: dict = {}
        for step in g.config_steps:
            _do(ctl, step, created, report)


def run_plan(host: HostRoot, plan: MigPlan, report: RunReport, *, skip_reset: bool = False,
             force: bool = False, before_phase: Callable[[str], None] = lambda phase: None,
             progress: Progress = quiet) -> None:
    """Run every step; raises at the first failure, leaving the node wherever it got."""
    changed = plan.changed
    with nvml_session(host):
        ctl = MigControl()
        mode = [g for g in changed if g.mode_steps or g.reset]
        if mode:
            before_phase("mode")
            # Only a real switch (or destroying instances to get there) needs the GPU idle;
            # cancelling a pending mode does not.
            switching = {g.index: None for g in mode if g.before.enabled != g.after.enabled
                         or any(s.action != SET_MODE for s in g.mode_steps)}
            if switching:
                _ensure_idle(ctl, switching, "GPUs changing MIG mode are", force=force,
                             report=report, progress=progress)
            _mode_phase(host, ctl, mode, skip_reset=skip_reset, report=report, progress=progress)
        config = [g for g in changed if g.config_steps]
        if config:
            before_phase("config")
            doomed = _doomed(config)
            if doomed:
                _ensure_idle(ctl, doomed, "MIG instances to be destroyed are", force=force,
                             report=report, progress=progress)
            _config_phase(ctl, config, report=report, progress=progress)


def _doomed(gpus: list[GpuPlan]) -> dict[int, set]:
    """GPU index -> the (gi, ci) and (gi, None) the config steps of ``gpus`` destroy."""
    doomed: dict[int, set] = {}
    for g in gpus:
        for s in g.config_steps:
            if s.action == DESTROY_CI:
                doomed.setdefault(g.index, set()).add((s.gi_id, s.ci_id))
            elif s.action == DESTROY_GI:
                doomed.setdefault(g.index, set()).add((s.gi_id, None))
    return doomed


def refuse_busy(host: HostRoot, plan: MigPlan,
                hint: str = "stop those processes, or pass --force to terminate them") -> None:
    """InUse, as the plan's run would raise it without ``force``, when processes use the MIG
    instances its config steps destroy; nothing is changed (for a caller that must know
    before it commits to the change)."""
    doomed = _doomed([g for g in plan.changed if g.config_steps])
    if not doomed:
        return
    with nvml_session(host):
        busy = _busy(MigControl(), doomed)
    if busy:
        raise _in_use("MIG instances to be destroyed are", busy, hint)


def verify(host: HostRoot, targets: dict[str, Layout], indices: dict[str, int]):
    """Re-read the node and require exactly the target layouts (by GPU UUID); returns the
    inventory read."""
    inventory = read_inventory(host)
    actual = {g.uuid: Layout.of(g) for g in inventory.gpus}
    wrong = [str(indices.get(u, u)) for u, want in targets.items()
             if u not in actual or not want.reached_by(actual[u])]
    if wrong:
        raise StateError(f"GPU {', '.join(wrong)}: the layout read back differs from the plan")
    return inventory
