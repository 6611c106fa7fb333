"""The sharing operations as the CLI (without the daemon) and the daemon call them: observe the
node, plan against the configuration, apply under the node lock, report.

The configuration is recorded (``/etc/hostagent/sharing.yaml``) once it is in place: a failed
apply is rolled back at once, and one a crash interrupted (its journal left) is settled by
the next ``apply``, ``off`` or agent start (``journal``).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ..devices import Inventory, read_inventory
from ..errors import ConflictError
from ..hostroot import HostRoot
from ..lock import node_lock
from . import mps
from .config import SharingConfig, config_path, load_persisted, render
from .executor import ApplyReport, execute
from .journal import SharingJournal
from .plan import Live, SharingPlan, plan
from .resolve import Desired, resolve
from .state import SharingState

__all__ = ["observe", "apply", "recover", "status", "Outcome", "refuse_allocated", "SharingBusy", "device_names",
           "answering", "pause", "mig_guard", "resume", "mps_devices"]


class SharingBusy(ConflictError):
    code = "device_busy"


@dataclass
class Outcome:
    plan: SharingPlan
    report: ApplyReport | None = None          # None for a dry run
    warnings: tuple[str, ...] = ()             # the configuration's keys ignored
    rolled_back: ApplyReport | None = None     # a step failed: the node brought back to what is recorded
    recovered: str | None = None               # an apply a crash interrupted, finished or rolled back first

    @property
    def failed(self) -> bool:
        return bool(self.report and self.report.failed)

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "dry_run": self.report is None,
                "report": self.report.to_dict() if self.report else None,
                "rolled_back": self.rolled_back.to_dict() if self.rolled_back else None,
                "recovered": self.recovered,
                "problems": list(self.plan.desired.problems), "warnings": list(self.warnings)}


def device_names(inventory: Inventory | None) -> dict[str, str]:
    out = {}
    for g in (inventory.gpus if inventory else ()):
        out[g.uuid] = f"GPU {g.index}"
        for d in (g.mig.devices if g.mig else ()):
            out[d.uuid] = f"MIG device {d.name}"
    return out


def answering(host: HostRoot, uuids, state: SharingState, timeout: float = mps.ANSWER_TIMEOUT) -> frozenset[str]:
    """The devices whose recorded MPS daemon runs and answers (probed in parallel)."""
    from ..processes import current
    candidates = [u for u in sorted(set(uuids)) if u in state.daemons and current(state.daemons[u].known)]
    if not candidates:
        return frozenset()
    with ThreadPoolExecutor(min(8, len(candidates))) as pool:
        answers = pool.map(lambda u: mps.probe(host, u, timeout), candidates)
        return frozenset(u for u, ok in zip(candidates, answers) if ok)


def compute_modes(host: HostRoot, inventory: Inventory, uuids) -> dict[str, str]:
    from ..devices import nvml_session
    from ..devices.computectl import ComputeControl
    present = {g.uuid for g in inventory.gpus}
    wanted = sorted(u for u in set(uuids) if u in present)
    if not wanted:
        return {}
    with nvml_session(host):
        ctl = ComputeControl()
        return {u: ctl.mode(u) for u in wanted}


def observe(host: HostRoot, inventory: Inventory, state: SharingState, desired: Desired) -> Live:
    gpus = set(desired.gpus) | set(state.saved_modes) | {d.gpu_uuid for d in state.devices.values()}
    daemons = set(state.daemons) | set(mps.find_daemons(host)) | set(desired.daemons)
    known = {u: r.known for u, r in state.daemons.items()}
    return Live(compute_modes(host, inventory, gpus), answering(host, daemons, state),
                frozenset(mps.leftovers(host, daemons, known)), device_names(inventory))


def refuse_allocated(state: SharingState, desired: Desired, allocations) -> None:
    """A device in an allocation keeps its sharing: changing its strategy (or sharing an
    unshared one, or the reverse) or taking replicas it uses away would pull the ground
    from under a running container."""
    busy: dict[str, list[str]] = {}
    for a in allocations:
        for uuid in a.devices:
            before, after = state.devices.get(uuid), desired.devices.get(uuid)
            same = (before is None and after is None) or (
                before is not None and after is not None and before.strategy == after.strategy
                and after.replicas >= before.replicas)
            if not same:
                busy.setdefault(uuid, []).append(a.id)
    if busy:
        names = "; ".join(f"{u} (allocation(s) {', '.join(ids)})" for u, ids in busy.items())
        raise SharingBusy(f"the sharing of devices in use would change: {names}",
                          hint="release those allocations first, or leave these devices' sharing as it is",
                          devices=sorted(busy), allocations=sorted({i for ids in busy.values() for i in ids}))


def _persist(host: HostRoot, config: SharingConfig) -> None:
    from ..fileio import ensure_dir, remove, write_atomic
    path = config_path(host)
    if config.empty:
        if path.exists():
            remove(path)
        return
    ensure_dir(path.parent, 0o755)
    write_atomic(path, render(config), mode=0o644)


def apply(host: HostRoot, config: SharingConfig | None, *, dry_run: bool = False, allocations=(),
          interpreter: str = sys.executable, lock_timeout: float | None = 60.0,
          on_lock_wait=None, only: set[str] | None = None, persist: bool = True) -> Outcome:
    """Apply ``config``; bad input is refused before anything changes. ``config`` None:
    reconcile with the configuration in force (a start, a restart of failed daemons, a
    changed node), where devices that went away are left out and named in the plan's
    problems instead of failing it. ``only``: just the steps on these devices and GPUs (one
    daemon's restart). ``persist`` False: the configuration is the file already (a reload).

    A new configuration is journaled while it changes the node and recorded only once every
    step succeeded; a step that fails brings the node back to the configuration recorded
    (``rolled_back``), so nothing of the failed one stays. An apply a crash interrupted is
    settled first, the same way (``journal``)."""
    with node_lock(host, "sharing apply", timeout=lock_timeout, on_wait=on_lock_wait):
        recovered = None if dry_run else recover(host, interpreter)
        if config is None:
            return replace(_reconcile(host, interpreter, only=only, dry_run=dry_run), recovered=recovered)
        inventory = read_inventory(host)
        state = SharingState.load(host)
        desired = resolve(inventory, config, strict=True)
        refuse_allocated(state, desired, allocations)
        p = plan(desired, state, observe(host, inventory, state, desired))
        if dry_run or not persist:
            report = None if dry_run else execute(host, p, state, interpreter=interpreter)
            return Outcome(p, report, config.warnings, recovered=recovered)
        journal = SharingJournal.begin(host, load_persisted(host).document or None, config.document or None)
        report = execute(host, p, state, interpreter=interpreter)
        back = None
        if report.failed:
            back = _reconcile(host, interpreter).report
        else:
            _persist(host, config)
        journal.finish()
        return Outcome(p, report, config.warnings, back, recovered)


def _reconcile(host: HostRoot, interpreter: str, *, only: set[str] | None = None, dry_run: bool = False) -> Outcome:
    """Bring the node to the configuration recorded; the caller holds the node lock."""
    config = load_persisted(host)
    inventory = read_inventory(host)
    state = SharingState.load(host)
    desired = resolve(inventory, config, strict=False)
    p = plan(desired, state, observe(host, inventory, state, desired))
    if only is not None:
        p = SharingPlan(p.desired, tuple(s for s in p.steps if s.target in only))
    if dry_run:
        return Outcome(p, warnings=config.warnings)
    return Outcome(p, execute(host, p, state, interpreter=interpreter), config.warnings)


def recover(host: HostRoot, interpreter: str = sys.executable) -> str | None:
    """Settle an apply a crash interrupted (its journal is there): the node is brought to the
    configuration recorded, which rolls it back, or finishes it if it was recorded already.
    The caller holds the node lock. What was done, or None."""
    journal = SharingJournal.load(host)
    if journal is None:
        return None
    outcome = _reconcile(host, interpreter)
    journal.finish()
    done = "finished" if load_persisted(host).document == (journal.record["after"] or {}) else "rolled back"
    failed = f" ({len(outcome.report.failed)} step(s) failed)" if outcome.failed else ""
    return f"{done} {journal.describe()}{failed}"


def status(host: HostRoot, inventory: Inventory | None = None, daemons: dict | None = None) -> dict:
    """What is shared, how, and what the node shows: ``GET /v1/sharing`` and ``sharing status``.
    ``daemons``: uuid -> the supervisor's view of each daemon (the daemon's own status);
    without it, each daemon is probed."""
    state = SharingState.load(host)
    config = load_persisted(host)
    inventory = inventory if inventory is not None else read_inventory(host)
    present = set(device_names(inventory))
    if daemons is None:
        live = answering(host, state.daemons, state)
        daemons = {u: {"state": "ready" if u in live else "down"} for u in state.daemons}
    modes = compute_modes(host, inventory, {d.gpu_uuid for d in state.devices.values()} | set(state.saved_modes))
    devices = []
    for uuid, d in sorted(state.devices.items(), key=lambda i: (i[1].gpu_index, i[1].kind, i[1].name)):
        entry = {"uuid": uuid, "name": d.name, "kind": d.kind, "gpu_uuid": d.gpu_uuid, **d.to_dict(),
                 "replica_ids": list(d.replica_ids), "present": uuid in present, "mps": None}
        if d.strategy == "mps":
            record = state.daemons.get(uuid)
            entry["mps"] = {"pipe_directory": str(mps.pipe_dir(host, uuid)),
                            "log_directory": str(mps.log_dir(host, uuid)),
                            "pid": record.pid if record else None, "started": record.started if record else None,
                            "restarts": record.restarts if record else 0,
                            **daemons.get(uuid, {"state": "down"})}
        devices.append(entry)
    index = {g.uuid: g.index for g in inventory.gpus}
    gpus = [{"uuid": u, "index": index.get(u), "compute_mode": modes.get(u),
             "saved_compute_mode": state.saved_modes.get(u), "interval": state.intervals.get(u, "Default")}
            for u in sorted(set(modes) | set(state.saved_modes) | set(state.intervals),
                            key=lambda u: (index.get(u, 1 << 30), u))]
    return {"config": {"path": str(config_path(host)), "document": config.document} if not config.empty else None,
            "strategies": sorted({d.strategy for d in state.devices.values()}),
            "devices": devices, "gpus": gpus}


def mps_devices(host: HostRoot, devices) -> list[str]:
    """Labels of the devices among ``devices`` that MPS shares now."""
    state = SharingState.load(host)
    return [d.label for u, d in sorted(state.devices.items()) if d.strategy == "mps" and u in set(devices)]


def pause(host: HostRoot, devices) -> list[str]:
    """Stop the MPS daemons of these devices before a MIG change takes them away (their
    servers hold the device: a reset or an instance's destruction fails while they run).
    The configuration stays; the next reconcile (``apply(host, None)``) starts the daemons of
    the devices it still names. Returns the labels of the daemons stopped."""
    stopped = []
    devices = set(devices)
    with node_lock(host, "sharing: stop MPS daemons for a MIG change"):
        state = SharingState.load(host)
        for uuid, d in sorted(state.devices.items()):
            if d.strategy != "mps" or uuid not in devices:
                continue
            record = state.daemons.pop(uuid, None)
            mps.stop(host, uuid, record.known if record else None)
            if record is not None:
                stopped.append(d.label)
        if stopped:
            state.save(host)
    return stopped


def mig_guard(host: HostRoot, refuse, dry_run: bool, progress):
    """``refuse`` for a MIG change (the daemon's, or the CLI's without it): the caller's
    checks, then the MPS daemons of the devices the change takes away stop right before it
    (a dry run names them). Afterwards the configuration in force is restored (the daemon's
    reconcile, or ``resume``)."""
    def guard(inventory, plan) -> None:
        refuse(inventory, plan)
        from ..mig.plan import affected_devices
        affected = affected_devices(inventory, plan)
        if dry_run:
            names = mps_devices(host, affected)
            if names:
                progress(None, f"MPS daemons of {', '.join(names)} would stop for the change")
            return
        stopped = pause(host, affected)
        if stopped:
            progress(None, f"MPS daemons of {', '.join(stopped)} stopped for the MIG change")
    return guard


def resume(host: HostRoot, progress) -> None:
    """After a MIG change without the daemon: the sharing configuration in force is brought
    back (daemons for the devices it names now). A failure is reported, never a reason to
    undo the layout."""
    from ..errors import HostagentError
    if not config_path(host).exists():
        return
    try:
        outcome = apply(host, None)
    except HostagentError as e:
        progress(None, f"warning: GPU sharing not restored: {e.message}")
        return
    for r in outcome.report.results if outcome.report else ():
        if r.step.action == "start_daemon":
            progress(None, ("" if r.ok else "FAILED: ") + r.step.describe() + ("" if r.ok else f": {r.error}"))
