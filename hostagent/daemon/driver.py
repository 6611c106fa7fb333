"""The daemon's driver readiness gate: the one place that says whether the NVIDIA driver
may be used.

The gate verifies the driver (``hostagent.driver.verify``, the checks of ``driver verify``)
at start, on reload, on request, while it does not verify (every 2 s doubling to
``driver.retry_max``) and every ``driver.interval`` while it does. Until it verifies, the
daemon writes no CDI spec, applies no MIG layout, makes no allocation and starts no MPS
daemon; it stays up, degraded, and says why (API, systemd STATUS, log, metrics). While it
verifies, the GPU operator's ``driver-ready`` marker exists.

For features built on the daemon (loop thread only):

    agent.driver.ready             True when the driver verified (or the gate is off)
    agent.driver.why               why not, one line ("" when ready)
    agent.driver.add_listener(fn)  fn(ready: bool), called whenever ``ready`` changes
    agent.driver.remove_listener(fn)
    await agent.driver.wait_ready()
    agent.driver.require(what)     raises DriverNotReady (API: 503 driver_not_ready) unless ready

``driver install`` puts the gate in maintenance through the API while it replaces the
driver: closed, NVML let go, nothing verified, until it ends or its process is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..errors import UnavailableError

__all__ = ["DriverGate", "DriverSettings", "DriverNotReady"]

log = logging.getLogger("hostagent.daemon")

VERIFYING, READY, DEGRADED, DISABLED, MAINTENANCE = "verifying", "ready", "degraded", "disabled", "maintenance"


class DriverNotReady(UnavailableError):
    code = "driver_not_ready"


@dataclass(frozen=True)
class DriverSettings:
    gate: bool = True
    ignore: tuple[str, ...] = ()
    markers: bool = True
    markers_dir: str = "/run/nvidia/validations"
    retry_max: float = 60
    interval: float = 60

    @classmethod
    def from_sections(cls, sections: dict) -> "DriverSettings":
        raw = dict(sections.get("driver") or {})
        raw["ignore"] = tuple(raw.get("ignore") or ())
        return cls(**{k: v for k, v in raw.items() if v is not None})


class DriverGate:
    def __init__(self, agent):
        from ..driver.markers import Markers
        self.agent = agent
        self.settings = DriverSettings.from_sections(agent.settings.sections)
        self.markers = Markers(agent.host, self.settings.markers_dir, self.settings.markers)
        self.state = VERIFYING if self.settings.gate else DISABLED
        self.verdict = None                 # the last Verdict
        self.checked_at: float | None = None
        self.since = time.time()            # when the state last changed
        self.verifications = 0
        self.maintenance: dict | None = None   # {"pid", "operation", "since"} while a driver install runs
        self._listeners: list = []
        self._marker_error: str | None = None
        self._lock = asyncio.Lock()
        self._ready_event = asyncio.Event()
        self._wake = asyncio.Event()        # maintenance began: watch() looks after its holder now
        if not self.settings.gate:
            self._ready_event.set()

    # ---- what other features ask ------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.state in (READY, DISABLED)

    @property
    def why(self) -> str:
        if self.ready:
            return ""
        if self.maintenance is not None:
            m = self.maintenance
            return f"the driver is being changed ({m['operation']}, pid {m['pid']})"
        if self.verdict is None:
            return "the driver has not been verified yet"
        return f"the driver does not verify: {self.verdict.reason}"

    def add_listener(self, fn) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    async def wait_ready(self) -> None:
        await self._ready_event.wait()

    def require(self, what: str) -> None:
        if not self.ready:
            raise DriverNotReady(f"cannot {what}: {self.why}",
                                 hint="see GET /v1/driver or 'hostagent driver verify'")

    # ---- verification -------------------------------------------------------------------

    def clear_stale_marker(self) -> None:
        """At start: a marker a killed daemon left says nothing about the driver now."""
        self.markers.not_ready()

    def reconfigure(self, sections: dict) -> None:
        """Reload: new settings take effect at the next verification (which follows)."""
        from ..driver.markers import Markers
        new = DriverSettings.from_sections(sections)
        if new.markers_dir != self.settings.markers_dir or not new.markers:
            self.markers.not_ready()
        self.settings = new
        self.markers = Markers(self.agent.host, new.markers_dir, new.markers)
        if not new.gate:
            self._set(DISABLED, None, "driver.gate is off")

    def _run(self):
        """Worker thread: verify, then write or remove the marker."""
        from ..driver.verify import verify
        verdict = verify(self.agent.host, self.settings.ignore)
        try:
            self.markers.ready() if verdict.usable else self.markers.not_ready()
        except OSError as e:            # a read-only or missing folder: the verdict stands
            if self._marker_error != str(e):
                log.warning("driver-ready marker not %s: %s", "written" if verdict.usable else "removed", e)
            self._marker_error = str(e)
        else:
            self._marker_error = None
        return verdict

    async def verify(self, reason: str):
        """Verify now (one at a time); returns the verdict, None with the gate off."""
        if not self.settings.gate or self.maintenance is not None:
            return self.verdict if self.settings.gate else None
        async with self._lock:
            try:
                verdict = await self.agent.blocking(self._run)
            except Exception:            # a bug in a check: say so, keep the state it had
                log.exception("driver verification failed (%s)", reason)
                return self.verdict
        self.verifications += 1
        self.checked_at = time.time()
        self.agent.metrics.driver_verified(verdict)
        self._set(READY if verdict.usable else DEGRADED, verdict, reason)
        return verdict

    def _set(self, state: str, verdict, reason: str) -> None:
        before, was_ready = self.verdict, self.ready
        changed = state != self.state or (verdict is not None and before is not None
                                          and verdict.reason != before.reason)
        if state != self.state:
            self.since = time.time()
        self.state, self.verdict = state, verdict
        self.agent.metrics.driver_ready.set(1 if self.ready else 0)     # 0 in maintenance too
        if changed or before is None:
            if state == DEGRADED:
                log.error("driver not usable (%s): %s", reason, verdict.reason,
                          extra={"fields": {"driver_failed": ",".join(c.name for c in verdict.blocking)}})
            elif state == READY:
                log.info("driver %s verified (%s)", verdict.driver_version, reason)
            self.agent.publish([("driver_changed", {"driver": self.view()})])
        if self.ready != was_ready:
            (self._ready_event.set if self.ready else self._ready_event.clear)()
            for listener in list(self._listeners):
                try:
                    listener(self.ready)
                except Exception:       # a feature's failure never stops the gate
                    log.exception("driver listener %r failed", listener)

    # ---- maintenance (driver install) -----------------------------------------------------

    async def enter_maintenance(self, pid: int, operation: str) -> None:
        """A driver install begins: the gate closes (features stop their GPU work), the
        monitor and the sampler let go of NVML, and nothing calls NVML until it ends."""
        self.maintenance = {"pid": pid, "operation": operation, "since": round(time.time(), 3)}
        self.markers.not_ready()
        log.warning("driver maintenance: %s (pid %d); GPU work held", operation, pid)
        self._wake.set()
        self._set(MAINTENANCE, self.verdict, "maintenance")
        for link in (self.agent.health_link, self.agent.metrics_link):
            if link is not None and link.started:
                try:
                    # the metrics page stays served: it says the driver is in maintenance
                    await (link.stop(endpoint=False) if link is self.agent.metrics_link else link.stop())
                except Exception:
                    log.exception("%s did not stop for maintenance", type(link).__name__)
        try:                # MPS servers hold GPUs: the modules could not unload
            await self.agent.sharing.stop_daemons("driver maintenance")
        except Exception:
            log.exception("MPS daemons did not stop for maintenance")

    async def leave_maintenance(self, reason: str) -> None:
        """The install is over (or its process gone): verify again; the monitor and the
        sampler restart at the next check."""
        if self.maintenance is None:
            return
        log.info("driver maintenance over (%s)", reason)
        self.maintenance = None
        self._set(VERIFYING if self.settings.gate else DISABLED, self.verdict, reason)
        await self.agent.verify_driver(reason)

    def _holder_gone(self) -> bool:
        if self.maintenance is None:
            return False
        from ..fileio import pid_alive
        return not pid_alive(self.maintenance["pid"])

    # ---- views --------------------------------------------------------------------------

    def summary(self) -> dict:
        """For GET /v1/node: the state and why."""
        v = self.verdict
        return {"state": self.state, "ready": self.ready, "reason": self.why or (v.reason if v else None),
                "version": v.driver_version if v else None,
                "failed": [c.name for c in v.blocking] if v else []}

    def view(self) -> dict:
        """For GET /v1/driver: the summary, when, the markers and every check."""
        v = self.verdict
        return {**self.summary(), "since": round(self.since, 3), "maintenance": self.maintenance,
                "checked_at": round(self.checked_at, 3) if self.checked_at else None,
                "verifications": self.verifications,
                "cuda_version": v.cuda_version if v else None,
                "markers": {"enabled": self.markers.enabled, "path": str(self.markers.path),
                            "written": self.markers.written()},
                "interrupted": self._interrupted(),
                "checks": [c.to_dict() for c in v.checks] if v else []}

    def _interrupted(self) -> str | None:
        """A driver install or rollback whose process is gone before it finished."""
        from ..driver.journal import Journal
        from ..errors import HostagentError
        try:
            journal = Journal.load(self.agent.host)
        except HostagentError as e:
            return e.message
        if journal is None or journal.alive:
            return None
        return f"{journal.describe()} was interrupted: 'hostagent driver install' of that version or " \
               "'hostagent driver rollback' finishes it"

    async def watch(self) -> None:
        """Re-verify: with back-off while not ready, every ``interval`` while ready. A
        driver that comes to verify has the agent re-read the node (CDI spec, allocations)."""
        backoff = 2.0
        while True:
            if not self.settings.gate:
                delay = 3600.0
            elif self.state != READY:
                delay, backoff = min(backoff, self.settings.retry_max), min(backoff * 2, self.settings.retry_max)
            else:
                delay, backoff = self.settings.interval or 3600.0, 2.0
            if self.maintenance is None:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            else:
                await asyncio.sleep(min(delay, 5.0))
            if self._holder_gone():
                log.warning("the process holding driver maintenance (pid %d) is gone",
                            self.maintenance["pid"])
                await self.leave_maintenance("maintenance holder gone")
                continue
            if self.maintenance is not None or (self.state == READY and not self.settings.interval):
                continue
            await self.agent.verify_driver("periodic" if self.ready else "retry")
