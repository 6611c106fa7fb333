"""Per-device health as a value, and the pure transitions that change it.

Every function takes a ``HealthState`` and returns ``(new_state, changed_records)``; the
state is never modified in place, and the revision grows by one whenever anything changed.

- A critical event (an XID outside the ignore list, a double-bit ECC error) makes a device
  unhealthy until ``quiet_period`` seconds pass without another one: a transient XID does
  not take a GPU away forever. ``quiet_period`` None (or 0) keeps it unhealthy until cleared.
- A lost GPU stays unhealthy until cleared (or the node restarts): no quiet period brings
  back a GPU that fell off the bus. It is also unwatched (``lost``, not ``monitored``)
  until the event source can register it again, so a clear makes it ``unmonitored``, not
  healthy: nobody would see its next XID.
- ``unmonitored`` is kept apart from health: a device nobody watches is not called healthy.
- An XID the policy ignores leaves the device healthy; it stays as the device's ``notice``
  for as long as a counted one would have kept it unhealthy, so consumers can report it
  (the DRA plugin's informational taint), and goes the same way.
- ``clear`` is the operator's word: the named devices (a GPU with its MIG devices) are
  healthy again now.
- ``rebase`` carries a state into a new monitor (a reload, a restart): reasons the new XID
  policy ignores go, recoveries follow the new quiet period.
- A GPU that leaves the inventory (passed through to a VM: NVML no longer lists it) keeps
  its record aside, by UUID, and takes it back when it returns: an unhealthy GPU bound back
  to the nvidia driver is still unhealthy, its quiet period counted meanwhile.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable

from ..errors import UnknownName
from .fanout import DeviceIndex
from .records import ECC_DBE, GPU_LOST, UNMONITORED, XID, DeviceHealth, HealthEvent, Reason

__all__ = ["HealthState", "initial", "apply_event", "recover_due", "clear", "set_monitored",
           "reconcile", "rebase", "next_due", "LOST_DETAIL"]

LOST_DETAIL = "the GPU is lost: not watched until NVML can read it again"


@dataclass(frozen=True)
class HealthState:
    devices: dict = field(default_factory=dict)   # key -> DeviceHealth, in inventory order
    revision: int = 0
    away: dict = field(default_factory=dict)      # GPU UUID -> its record, while out of the inventory

    def get(self, key: str) -> DeviceHealth | None:
        return self.devices.get(key)

    def resolve(self, ident: str) -> DeviceHealth:
        """A device by UUID, or by name as ``hostagent devices`` shows it ("0", "0:3")."""
        ident = str(ident).strip()
        found = self.devices.get(ident) or next(
            (d for d in self.devices.values() if d.name == ident), None)
        if found is None:
            raise UnknownName(f"no device {ident!r} in the health state", name=ident,
                              hint="use a GPU index or UUID, a MIG UUID or GPU:MIG as "
                                     "'hostagent health status' lists them")
        return found

    @property
    def unhealthy(self) -> tuple[DeviceHealth, ...]:
        return tuple(d for d in self.devices.values() if not d.healthy)

    def to_dict(self) -> dict:
        return {"revision": self.revision, "devices": [d.to_dict() for d in self.devices.values()]}


def _commit(state: HealthState, updates: dict[str, DeviceHealth]):
    changed = {k: v for k, v in updates.items() if state.devices.get(k) != v}
    if not changed:
        return state, ()
    devices = {k: changed.get(k, v) for k, v in state.devices.items()}
    devices.update({k: v for k, v in changed.items() if k not in devices})
    return HealthState(devices, state.revision + 1, state.away), tuple(changed.values())


def _with_state_change(old: DeviceHealth, new: DeviceHealth, now: float) -> DeviceHealth:
    return new if new.state == old.state else dataclasses.replace(new, changed_at=now)


def initial(index: DeviceIndex, now: float) -> HealthState:
    return HealthState({r.key: DeviceHealth(r.key, r.name, r.gpu, r.gi, r.ci, changed_at=now)
                        for r in index.refs()})


def _recover_at(reasons: tuple[Reason, ...], quiet_period: float | None) -> float | None:
    if not reasons or not quiet_period or any(r.sticky for r in reasons):
        return None
    return max(r.at for r in reasons) + quiet_period


def apply_event(state: HealthState, event: HealthEvent, *, quiet_period: float | None,
                now: float):
    updates = {}
    for key in event.devices:
        old = state.devices.get(key)
        if old is None:
            continue
        new = old
        if event.kind in (XID, ECC_DBE, GPU_LOST):
            new = dataclasses.replace(new, last_event_at=event.at)
            if event.kind == XID:
                new = dataclasses.replace(new, last_xid=event.xid)
        if event.kind == UNMONITORED:
            new = dataclasses.replace(new, monitored=False, monitor_detail=event.detail)
        elif event.kind == GPU_LOST and old.lost:
            pass                # already known lost (a new NVML session saw it again): a
                                # clear given since stands
        elif event.kind == XID and event.ignored:
            new = dataclasses.replace(new, notice=Reason(XID, event.at, event.xid, gpu_wide=event.gi is None),
                                      notice_until=event.at + quiet_period if quiet_period else None)
        elif event.critical:
            reason = Reason(event.kind, event.at, event.xid, gpu_wide=event.gi is None,
                            sticky=event.kind == GPU_LOST, detail=event.detail)
            reasons = new.reasons + (reason,)
            new = dataclasses.replace(new, healthy=False, reasons=reasons,
                                      recover_at=_recover_at(reasons, quiet_period))
            if event.kind == GPU_LOST:
                new = dataclasses.replace(new, lost=True, monitored=False, monitor_detail=LOST_DETAIL)
        updates[key] = _with_state_change(old, new, now)
    return _commit(state, updates)


def recover_due(state: HealthState, now: float):
    """Devices whose quiet period has passed become healthy; notices whose time is up go."""
    updates = {}
    for key, old in state.devices.items():
        new = old
        if old.recover_at is not None and old.recover_at <= now:
            new = dataclasses.replace(new, healthy=True, reasons=(), recover_at=None)
        if old.notice_until is not None and old.notice_until <= now:
            new = dataclasses.replace(new, notice=None, notice_until=None)
        if new is not old:
            updates[key] = _with_state_change(old, new, now)
    return _commit(state, updates)


def next_due(state: HealthState) -> float | None:
    due = [t for d in state.devices.values() for t in (d.recover_at, d.notice_until) if t is not None]
    return min(due) if due else None


def clear(state: HealthState, idents: Iterable[str] | None, now: float):
    """Make devices healthy now: all of them (``idents`` None), or the named ones; naming a
    GPU clears its MIG devices too. Unknown names raise NotFoundError, nothing changes."""
    if idents is None:
        targets = list(state.devices.values())
    else:
        targets = []
        for ident in idents:
            dev = state.resolve(ident)
            targets.append(dev)
            if not dev.is_mig:
                targets += [d for d in state.devices.values() if d.gpu == dev.gpu and d.is_mig]
    updates = {}
    for old in targets:
        new = dataclasses.replace(old, healthy=True, reasons=(), recover_at=None, notice=None, notice_until=None)
        updates[old.key] = _with_state_change(old, new, now)
    state, changed = _commit(state, updates)
    if idents is None and state.away:
        state = dataclasses.replace(state, away={})     # GPUs passed through: healthy when they return
    return state, changed


def set_monitored(state: HealthState, gpus: Iterable[int], now: float):
    """The event source watches these GPUs (again): they and their MIG devices are monitored
    (a lost GPU read again too; its sticky reason still waits for a clear)."""
    gpus = set(gpus)
    updates = {}
    for key, old in state.devices.items():
        if old.gpu in gpus and not old.monitored:
            new = dataclasses.replace(old, monitored=True, monitor_detail="", lost=False)
            updates[key] = _with_state_change(old, new, now)
    return _commit(state, updates)


def reconcile(state: HealthState, index: DeviceIndex, now: float):
    """Follow an inventory change: records of vanished devices go (a whole GPU's aside, to
    take back when it returns), new MIG devices inherit their GPU's GPU-wide reasons and
    monitoring, records that stay keep their history."""
    keys = {ref.key for ref in index.refs()}
    away = {k: d for k, d in state.away.items() if k not in keys}
    away.update({k: d for k, d in state.devices.items()
                 if k not in keys and not d.is_mig and not k.startswith("gpu:")})
    devices = {}
    for ref in index.refs():
        old = state.devices.get(ref.key) or (state.away.get(ref.key) if ref.gi is None else None)
        if old is not None:
            devices[ref.key] = dataclasses.replace(old, name=ref.name, gpu=ref.gpu, gi=ref.gi, ci=ref.ci)
            continue
        new = DeviceHealth(ref.key, ref.name, ref.gpu, ref.gi, ref.ci, changed_at=now)
        parent = state.devices.get(index.gpus[ref.gpu].key)
        if ref.gi is not None and parent is not None:
            inherited = tuple(r for r in parent.reasons if r.gpu_wide)
            new = dataclasses.replace(new, healthy=not inherited, reasons=inherited,
                                      recover_at=parent.recover_at if inherited else None,
                                      monitored=parent.monitored, monitor_detail=parent.monitor_detail,
                                      lost=parent.lost)
            if parent.notice is not None and parent.notice.gpu_wide:
                new = dataclasses.replace(new, notice=parent.notice, notice_until=parent.notice_until)
        devices[ref.key] = new
    if devices == state.devices and list(devices) == list(state.devices) and away == state.away:
        return state, ()
    changed = tuple(d for k, d in devices.items() if state.devices.get(k) != d)
    return HealthState(devices, state.revision + 1, away), changed


def rebase(state: HealthState, policy, quiet_period: float | None, now: float):
    """``state`` under a new monitor's settings: XID reasons ``policy`` now ignores are
    dropped (a device left without reasons is healthy), recovery times follow
    ``quiet_period`` (a recovery already due happens at the monitor's first turn), and so
    does a notice (one whose XID now counts goes). XIDs that were ignored and now count are
    not replayed: policy applies from the events it sees."""
    updates = {}
    for key, old in state.devices.items():
        reasons = tuple(r for r in old.reasons if not (r.kind == XID and policy.ignored(r.xid)))
        notice = old.notice if old.notice is not None and policy.ignored(old.notice.xid) else None
        new = dataclasses.replace(old, reasons=reasons, healthy=not reasons,
                                  recover_at=_recover_at(reasons, quiet_period), notice=notice,
                                  notice_until=notice.at + quiet_period if notice and quiet_period else None)
        updates[key] = _with_state_change(old, new, now)
    return _commit(state, updates)
