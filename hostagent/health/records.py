"""Health records: what happened (``HealthEvent``), what a device's health is
(``DeviceHealth``), and what the monitor publishes (``HealthUpdate``). Plain, immutable,
JSON-ready through ``to_dict``; no NVML handles anywhere."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["XID", "ECC_DBE", "GPU_LOST", "UNMONITORED", "KINDS", "HealthEvent", "Reason",
           "DeviceHealth", "HealthUpdate", "HEALTHY", "UNHEALTHY", "STATE_UNMONITORED"]

XID, ECC_DBE, GPU_LOST, UNMONITORED = "xid", "ecc_dbe", "gpu_lost", "unmonitored"
KINDS = (XID, ECC_DBE, GPU_LOST, UNMONITORED)
HEALTHY, UNHEALTHY, STATE_UNMONITORED = "healthy", "unhealthy", "unmonitored"


# hostagent.health.fanout.to_health_event(); HealthUpdate.event
@dataclass(frozen=True)
class HealthEvent:
    kind: str                          # xid | ecc_dbe | gpu_lost | unmonitored
    gpu: int                           # NVML index of the physical GPU
    gpu_uuid: str | None
    at: float
    xid: int | None = None
    ignored: bool = False              # an XID in the ignore list: recorded, not unhealthy
    gi: int | None = None              # the MIG instance the driver scoped it to; None: GPU-wide
    ci: int | None = None
    devices: tuple[str, ...] = ()      # keys (UUIDs) of every device it affects
    allocations: tuple[str, ...] = ()  # allocations using any of them
    unresolved: bool = False           # scoped to an instance the inventory does not know
    detail: str = ""

    @property
    def critical(self) -> bool:
        """Whether it makes the affected devices unhealthy."""
        return self.kind in (XID, ECC_DBE, GPU_LOST) and not self.ignored

    def to_dict(self) -> dict:
        return asdict(self)


# DeviceHealth.reasons
@dataclass(frozen=True)
class Reason:
    kind: str                          # xid | ecc_dbe | gpu_lost
    at: float
    xid: int | None = None
    gpu_wide: bool = True              # False: scoped to this MIG instance
    sticky: bool = False               # no recovery by quiet period (a lost GPU)
    detail: str = ""

    def __str__(self) -> str:
        text = f"XID {self.xid}" if self.kind == XID else self.kind.replace("_", " ")
        return text if self.gpu_wide else f"{text} (instance)"


# hostagent.health.state.HealthState.devices
@dataclass(frozen=True)
class DeviceHealth:
    key: str                           # the device's UUID (``gpu:<index>`` for an unreadable GPU)
    name: str                          # "0", or "0:3" for a MIG device
    gpu: int
    gi: int | None = None
    ci: int | None = None
    healthy: bool = True
    monitored: bool = True
    reasons: tuple[Reason, ...] = ()   # why it is unhealthy
    last_xid: int | None = None        # the last XID seen, ignored ones included
    last_event_at: float | None = None
    changed_at: float = 0.0            # when ``state`` last changed
    recover_at: float | None = None    # healthy again then, if quiet; None: no recovery pending
    monitor_detail: str = ""           # why it is unmonitored
    lost: bool = False                 # on a GPU NVML reported lost: unwatched until it reads again
    # The last XID the policy ignores, reported (not unhealthy) until ``notice_until``: as long
    # as a counted one would have kept the device unhealthy (None: until cleared).
    notice: Reason | None = None
    notice_until: float | None = None

    @property
    def state(self) -> str:
        if not self.healthy:
            return UNHEALTHY
        return HEALTHY if self.monitored else STATE_UNMONITORED

    @property
    def is_mig(self) -> bool:
        return self.gi is not None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["state"] = self.state
        return out


# hostagent.health.monitor.HealthMonitor subscribers
@dataclass(frozen=True)
class HealthUpdate:
    revision: int                      # increases by one per update; a watcher resumes from it
    at: float
    cause: str                         # event | recovered | cleared | monitoring | inventory
    event: HealthEvent | None = None
    changes: tuple[DeviceHealth, ...] = ()   # the records that changed, as they are now

    def to_dict(self) -> dict:
        return {"revision": self.revision, "at": self.at, "cause": self.cause,
                "event": self.event.to_dict() if self.event else None,
                "changes": [d.to_dict() for d in self.changes]}
