"""The health monitor inside the daemon: its updates become device health in the agent's
views, ``health_event`` events on the watch stream, and allocation marks.

The monitor runs on its own thread and calls back under its lock; the callback only hops
to the event loop (``call_soon_threadsafe``), where the agent's state is changed, so the
agent keeps one writer. Records are taken from the monitor's state directly at start and
after an inventory change (so new devices never flash ``unmonitored``); an update queued
before such a sync is then skipped by revision, and only its event is published.

A monitor that dies is logged, its devices are marked unmonitored, and it is restarted by
``check()`` (the daemon calls it periodically): health monitoring never silently stops.
A monitor started after another (a restart, or a reload's new link given ``carried``)
starts from the previous one's state: an unhealthy device stays unhealthy, a lost GPU
lost, the last XIDs stay.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..errors import NotFoundError, UnavailableError
from .health import Health, api_health

__all__ = ["HealthLink", "event_view"]

log = logging.getLogger("hostagent.daemon")


def event_view(event) -> dict:
    """A ``HealthEvent`` as the watch stream carries it."""
    out = event.to_dict()
    out["at"] = round(out["at"], 3)
    out["devices"] = list(out["devices"])
    out["allocations"] = list(out["allocations"])
    return out


class HealthLink:
    def __init__(self, agent, options):
        self.agent = agent
        self.options = options               # HealthOptions (state file off: the API serves it)
        self.monitor = None
        self.carried = None                  # the last monitor's HealthState, for the next one
        self._synced = -1                    # the monitor revision agent.health reflects
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    @property
    def enabled(self) -> bool:
        return self.options.enabled

    @property
    def started(self) -> bool:
        return self.monitor is not None

    @property
    def state(self):
        """The monitor's ``HealthState``, or None (for the metrics exporter and the API)."""
        monitor = self.monitor
        return monitor.state if monitor is not None else None

    @property
    def running(self) -> bool:
        return self.monitor is not None and self.monitor.running

    # ---- lifecycle (event loop) ---------------------------------------------------------

    async def start(self, inventory) -> None:
        """Start watching ``inventory``'s GPUs; returns once they are registered and the
        agent's views show the result (published)."""
        from ..health import HealthMonitor
        if not self.enabled or inventory is None or self.monitor is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        monitor = HealthMonitor(self.agent.host, inventory, self.options,
                                allocations=self._allocations, metrics=self.agent.metrics,
                                previous=self.carried)
        monitor.subscribe(lambda update: self._post(monitor, update))
        self.monitor = monitor
        self._synced = -1
        await asyncio.to_thread(monitor.start, wait=10.0)
        if self.monitor is monitor:
            self.sync()
            self.agent.publish()

    async def stop(self, wait: float = 5.0) -> None:
        """Stop the monitor; its thread notices within one NVML wait (``wait_timeout_ms``).
        ``wait`` bounds how long that is awaited: a daemon exiting need not wait out a wait
        (the thread is a daemon thread; its updates no longer reach the agent)."""
        self._stopping = True
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            await asyncio.to_thread(monitor.stop, wait)
            self.carried = monitor.state

    async def check(self) -> None:
        """Restart a monitor whose thread ended without being stopped."""
        monitor = self.monitor
        if monitor is None or self._stopping or monitor.running:
            return
        log.error("the health monitor stopped unexpectedly; its devices are unmonitored until it "
                  "is restarted")
        self.mark_unmonitored("the health monitor stopped unexpectedly; restarting it")
        await self.stop(1.0)                 # keeps its state for the restart
        await self.start(self.agent.inventory)

    def mark_unmonitored(self, why: str) -> None:
        now = time.time()
        self.agent.health = {uuid: Health("unmonitored", "unmonitored", why, now, monitored=False)
                             for uuid in self.agent.health}
        self.agent.publish()

    # ---- the agent's side (event loop) --------------------------------------------------

    def sync(self) -> None:
        """agent.health from the monitor's state, now; the caller publishes."""
        state = self.monitor.state
        self._synced = state.revision
        self.agent.health = {d.key: api_health(d) for d in state.devices.values()}

    def inventory_changed(self, inventory) -> None:
        """After an inventory read that changed it: follow the new devices (synchronously,
        so the publish that follows carries their health)."""
        if self.monitor is None:
            return
        self.monitor.update_inventory(inventory)
        self.sync()

    async def clear(self, devices: list[str] | None) -> list[str]:
        """``POST /v1/health/clear``: names of the devices that became healthy."""
        from .allocations import UnknownDevice
        monitor = self.monitor
        if monitor is None:
            raise UnavailableError("health monitoring is not running" if self.enabled else
                                   "health monitoring is disabled (health.enabled: false)")
        try:
            # A thread: clear takes the monitor's lock, which must never block the loop.
            update = await asyncio.to_thread(monitor.clear, devices)
        except NotFoundError as e:
            raise UnknownDevice(e.what, hint=e.hint) from None
        # The update's records reach agent.health through the loop before this resumes
        # (call_soon_threadsafe keeps order), so the answer's revision includes them.
        return [d.name for d in update.changes] if update else []

    # ---- the monitor's side ------------------------------------------------------------

    def _allocations(self, uuid: str):
        """Monitor thread: who uses a device, from the current (immutable) snapshot."""
        view = self.agent.snapshot.devices.get(uuid)
        return view["allocations"] if view else ()

    def _post(self, monitor, update) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._apply, monitor, update)
        except RuntimeError:
            pass                             # the loop is closing: the daemon is stopping

    def _apply(self, monitor, update) -> None:
        if monitor is not self.monitor:
            return                           # from a monitor since stopped or replaced
        before = []
        if update.event is not None:
            before.append(("health_event", {"cause": update.cause, "event": event_view(update.event)}))
        changed = False
        if update.revision > self._synced:
            self._synced = update.revision
            for dev in update.changes:
                health = api_health(dev)
                if self.agent.health.get(dev.key) != health:
                    self.agent.health[dev.key] = health
                    changed = True
        if before or changed:
            self.agent.publish(before)
