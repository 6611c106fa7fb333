"""From what is in force to what is wanted: the steps, in the order they must run (pure).

``plan(desired, state, live)`` compares the resolved configuration with the sharing state
hostagent recorded and what the node shows now (compute modes, which MPS daemons answer),
and lists what changes: daemons stop before the modes they relied on are restored, modes
are set before daemons start, a daemon that stopped answering is started again, a daemon
whose defaults changed is sent the new ones (they apply to the MPS servers it starts next:
its clients keep running). Replica changes touch nothing on the node; they are listed so
the plan says everything a client will see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .resolve import Desired, DeviceSharing
from .state import SharingState

__all__ = ["Step", "SharingPlan", "Live", "plan", "daemon_settings"]

ORDER = ("stop_daemon", "restore_interval", "restore_compute_mode", "set_compute_mode", "set_interval",
         "start_daemon", "configure_daemon", "share", "unshare")
NODE_ACTIONS = frozenset(ORDER) - {"share", "unshare"}


@dataclass(frozen=True)
class Live:
    """What the node shows now."""
    compute_modes: dict[str, str] = field(default_factory=dict)   # GPU uuid -> mode
    answering: frozenset[str] = frozenset()                       # devices whose recorded MPS daemon answers
    leftovers: frozenset[str] = frozenset()                       # devices with an MPS daemon nobody recorded
    names: dict[str, str] = field(default_factory=dict)           # uuid -> "GPU 3", "MIG device 0:1"


@dataclass(frozen=True)
class Step:
    action: str
    target: str                     # device or GPU uuid
    label: str                      # "GPU 3", "MIG device 0:1"
    detail: dict = field(default_factory=dict)

    def describe(self) -> str:
        d = self.detail
        return {
            "stop_daemon": f"{self.label}: stop its MPS control daemon (quit), remove its pipe and log directories",
            "restore_interval": f"{self.label}: time-slice {d.get('from')} -> Default",
            "restore_compute_mode": f"{self.label}: compute mode {d.get('from')} -> {d.get('to')} (as before sharing)",
            "set_compute_mode": f"{self.label}: compute mode {d.get('from')} -> {d.get('to')}",
            "set_interval": f"{self.label}: time-slice {d.get('from')} -> {d.get('to')}",
            "start_daemon": (f"{self.label}: {'restart' if d.get('restart') else 'start'} its MPS control daemon "
                             f"({d.get('active_thread_percentage')}% active threads, "
                             f"{d.get('pinned_memory_limit_mib')} MiB pinned memory per client)"
                             + (" (it stopped answering)" if d.get("restart") else "")),
            "configure_daemon": (f"{self.label}: MPS defaults {d.get('from')} -> {d.get('to')} "
                                 f"(for servers started from now on)"),
            "share": f"{self.label}: {d.get('summary')}",
            "unshare": f"{self.label}: no longer shared (was {d.get('summary')})",
        }[self.action]

    def to_dict(self) -> dict:
        return {"action": self.action, "device": self.target, "label": self.label, "detail": dict(self.detail),
                "description": self.describe()}


@dataclass(frozen=True)
class SharingPlan:
    desired: Desired
    steps: tuple[Step, ...]

    @property
    def changes_node(self) -> bool:
        return any(s.action in NODE_ACTIONS for s in self.steps)

    def to_dict(self) -> dict:
        return {"steps": [s.to_dict() for s in self.steps], "changes_node": self.changes_node,
                "devices": {u: {"name": d.name, **d.to_dict()} for u, d in self.desired.devices.items()}}

    def describe(self) -> list[str]:
        return [s.describe() for s in self.steps] or ["nothing to change"]


def daemon_settings(d: DeviceSharing) -> dict:
    return {"active_thread_percentage": d.active_thread_percentage,
            "pinned_memory_limit_mib": d.pinned_memory_limit_mib}


def _summary(d: DeviceSharing) -> str:
    name = d.resource + (f" as {d.rename}" if d.rename else "")
    text = f"{d.strategy}, {d.replicas} replica{'s' if d.replicas != 1 else ''} of {name}"
    if d.strategy == "time-slicing" and d.interval not in (None, "Default"):
        text += f", interval {d.interval}"
    return text


def plan(desired: Desired, state: SharingState, live: Live) -> SharingPlan:
    steps: list[Step] = []

    def label(uuid: str) -> str:
        d = desired.devices.get(uuid) or state.devices.get(uuid)
        return d.label if d else live.names.get(uuid, uuid)

    def gpu_label(uuid: str) -> str:
        g = desired.gpus.get(uuid)
        return f"GPU {g.index}" if g else live.names.get(uuid, next(
            (f"GPU {d.gpu_index}" for d in state.devices.values() if d.gpu_uuid == uuid), uuid))

    wanted = desired.daemons
    for uuid in sorted((set(state.daemons) | live.answering | live.leftovers) - set(wanted)):
        steps.append(Step("stop_daemon", uuid, label(uuid)))
    for uuid, interval in sorted(state.intervals.items()):
        g = desired.gpus.get(uuid)
        if interval != "Default" and (g is None or g.interval is None):
            steps.append(Step("restore_interval", uuid, gpu_label(uuid), {"from": interval}))
    for uuid, saved in sorted(state.saved_modes.items()):
        current = live.compute_modes.get(uuid)
        if uuid not in desired.gpus and current is not None and current != saved:
            steps.append(Step("restore_compute_mode", uuid, gpu_label(uuid), {"from": current, "to": saved}))
    for uuid, g in desired.gpus.items():
        current = live.compute_modes.get(uuid)
        if current is not None and current != g.compute_mode:
            steps.append(Step("set_compute_mode", uuid, gpu_label(uuid), {"from": current, "to": g.compute_mode}))
    for uuid, g in desired.gpus.items():
        now = state.intervals.get(uuid, "Default")
        if g.interval is not None and g.interval != now:
            steps.append(Step("set_interval", uuid, gpu_label(uuid), {"from": now, "to": g.interval}))
    for uuid, d in wanted.items():
        settings = daemon_settings(d)
        if uuid not in live.answering:
            steps.append(Step("start_daemon", uuid, label(uuid), {**settings, "restart": uuid in state.daemons}))
        elif state.daemons.get(uuid) is not None and state.daemons[uuid].settings != settings:
            steps.append(Step("configure_daemon", uuid, label(uuid),
                              {"from": _settings_text(state.daemons[uuid].settings), "to": _settings_text(settings),
                               **settings}))
    for uuid, d in desired.devices.items():
        before = state.devices.get(uuid)
        if before is None or _summary(before) != _summary(d) or before.fail_requests_greater_than_one != \
                d.fail_requests_greater_than_one:
            steps.append(Step("share", uuid, label(uuid), {"summary": _summary(d), "replicas": list(d.replica_ids)}))
    for uuid, before in state.devices.items():
        if uuid not in desired.devices:
            steps.append(Step("unshare", uuid, label(uuid), {"summary": _summary(before)}))
    steps.sort(key=lambda s: ORDER.index(s.action))      # stable: each action's steps keep their order
    return SharingPlan(desired, tuple(steps))


def _settings_text(s: dict) -> str:
    return f"{s.get('active_thread_percentage')}% / {s.get('pinned_memory_limit_mib')} MiB"
