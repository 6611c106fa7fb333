"""The health monitor: a thread that feeds NVML events into the health state and publishes
every change.

The thread owns the ``EventSource`` (NVML session and event set). Each turn it waits for
events (never longer than ``wait_timeout_ms``, less when a recovery is due), turns them
into typed events (``fanout``), applies them (``state``), recovers devices whose quiet
period passed, and answers clear requests from other processes. Each change becomes one
``HealthUpdate`` handed to the subscribers, in revision order.

When NVML cannot start (no driver, no library), every device is ``unmonitored`` and the
monitor retries with a growing pause; it never reports health it does not watch. Lost GPUs
are retried every ``LOST_RETRY`` seconds and watched again once NVML reads them.

A monitor that replaces another (a reload with new settings, a restart after a failure)
starts from its ``state``: health, last XIDs and the identity of lost GPUs (their records
keep their UUIDs) carry over, re-evaluated under the new XID policy and quiet period
(``state.rebase``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable

from ..errors import HostagentError
from ..hostroot import HostRoot
from . import clear_requests
from . import state as S
from .fanout import AllocationLookup, DeviceIndex, to_health_event
from .options import HealthOptions
from .records import UNMONITORED, HealthEvent, HealthUpdate

__all__ = ["HealthMonitor", "Subscriber", "LOST_RETRY"]

log = logging.getLogger("hostagent.health")

Subscriber = Callable[[HealthUpdate], None]
_RETRY_MAX = 30.0
LOST_RETRY = 5.0            # seconds between attempts to register lost GPUs again


class HealthMonitor:
    """Watches the GPUs of ``inventory`` until ``stop()``.

    ``allocations`` maps a device UUID to the allocations using it (the daemon's allocation
    store); ``metrics`` (an ``AgentMetrics``) counts events. Subscribers run on the thread
    that made the change (the monitor's, or the caller of ``clear``) under the monitor's
    lock: they must be quick and must not call ``stop``. ``previous``: the ``state`` of the
    monitor this one replaces (taken after its ``stop()``); without it every device starts
    healthy.
    """

    def __init__(self, host: HostRoot, inventory, options: HealthOptions | None = None, *,
                 allocations: AllocationLookup | None = None, metrics=None, clock=time.time,
                 previous: S.HealthState | None = None):
        self.host = host
        self.options = options or HealthOptions()
        self.policy = self.options.policy
        self.allocations = allocations
        self.metrics = metrics
        self.clock = clock
        now = clock()
        if previous is None:
            self._index = DeviceIndex.from_inventory(inventory)
            self._state = S.initial(self._index, now)
        else:
            # its records are the devices it knew: a lost GPU keeps its UUID and MIG devices
            self._index = DeviceIndex.from_inventory(inventory, previous.devices.values())
            state, _ = S.reconcile(previous, self._index, now)
            self._state, _ = S.rebase(state, self.policy, self.options.quiet_period, now)
        self._lock = threading.RLock()
        self._subscribers: list[Subscriber] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._generation = None

    # ---- the daemon's side -----------------------------------------------------------

    def start(self, *, wait: float | None = 10.0) -> None:
        """Start the thread; by default return once the GPUs are registered (or NVML failed),
        so events injected from then on are seen."""
        if self._thread is not None:
            raise RuntimeError("the health monitor is already running")
        self._stop.clear()
        self._ready.clear()
        self._generation = None
        self._thread = threading.Thread(target=self._run, name="hostagent-health", daemon=True)
        self._thread.start()
        if wait:
            self._ready.wait(wait)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(update)`` for every change from now on; returns the unsubscriber."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)
        return unsubscribe

    @property
    def state(self) -> S.HealthState:
        with self._lock:
            return self._state

    def last_xids(self) -> dict[str, int]:
        """Device key -> last XID seen (ignored ones included), for DCGM_FI_DEV_XID_ERRORS."""
        return {k: d.last_xid for k, d in self.state.devices.items() if d.last_xid is not None}

    def clear(self, devices: list[str] | None = None) -> HealthUpdate | None:
        """``hostagent health clear``: the named devices (None: all) are healthy now.
        Raises NotFoundError for a name it does not know. Returns the update, if any."""
        with self._lock:
            return self._change("cleared", lambda st, now: S.clear(st, devices, now))

    def update_inventory(self, inventory) -> None:
        """After a MIG change: follow the new devices (GPU-wide problems carry over to new
        MIG devices of an unhealthy GPU)."""
        with self._lock:
            self._index = DeviceIndex.from_inventory(inventory, self._state.devices.values())
            self._change("inventory", lambda st, now: S.reconcile(st, self._index, now))

    # ---- state changes ---------------------------------------------------------------

    def _change(self, cause: str, transition, event: HealthEvent | None = None) -> HealthUpdate | None:
        now = self.clock()
        new, changed = transition(self._state, now)
        if not changed and event is None:
            self._state = new           # nothing to say (a GPU's record set aside), kept all the same
            return None
        if new is self._state:          # an event that changed no record is still news
            new = dataclasses.replace(new, revision=new.revision + 1)
        self._state = new
        update = HealthUpdate(new.revision, now, cause, event, changed)
        self._publish(update)
        return update

    def _write_file(self) -> None:
        if not self.options.state_file:
            return
        from .statefile import write_state
        try:
            write_state(self.host, self._state, policy=self.policy.describe(),
                        quiet_period=self.options.quiet_period)
        except OSError as e:
            log.warning("cannot write the health state file: %s", e)

    def _publish(self, update: HealthUpdate) -> None:
        self._write_file()
        for callback in list(self._subscribers):
            try:
                callback(update)
            except Exception:
                log.exception("health subscriber %r failed", callback)

    def _on_raw(self, raw) -> None:
        with self._lock:
            event = to_health_event(raw, self._index, self.policy, self.allocations)
            if self.metrics is not None:
                self.metrics.health_event(event.kind, event.ignored)
            level = logging.WARNING if event.critical or event.kind == UNMONITORED else logging.INFO
            log.log(level, "GPU %d: %s%s%s (%d device(s))", event.gpu, event.kind,
                    f" {event.xid}" if event.xid is not None else "",
                    " ignored" if event.ignored else "", len(event.devices))
            self._change("event", lambda st, now: S.apply_event(
                st, event, quiet_period=self.options.quiet_period, now=now), event)

    def _unmonitored_all(self, why: str) -> None:
        from ..devices.events import RawEvent
        now = self.clock()
        for index, ref in sorted(self._index.gpus.items()):
            record = self.state.get(ref.key)
            if record is None or record.monitored:
                self._on_raw(RawEvent(UNMONITORED, index, ref.uuid, now, detail=why))

    # ---- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        from ..devices.events import EventSource
        pause = 1.0
        while not self._stop.is_set():
            with self._lock:       # known lost: not reported again, retried
                lost = {d.gpu for d in self._state.devices.values() if d.lost and not d.is_mig}
            source = EventSource(self.host, clock=self.clock, lost=lost)
            try:
                for raw in source.open():
                    self._on_raw(raw)
            except HostagentError as e:
                log.error("health monitoring cannot start: %s", e.message)
                self._unmonitored_all(f"NVML: {e.what}")
                self._ready.set()
                self._idle(pause)
                pause = min(pause * 2, _RETRY_MAX)
                continue
            except Exception:
                log.exception("health monitoring failed to start")
                self._unmonitored_all("health monitoring failed to start")
                self._ready.set()
                self._idle(pause)
                pause = min(pause * 2, _RETRY_MAX)
                continue
            pause = 1.0
            try:
                self._watch(source)
            except Exception:
                log.exception("health monitoring stopped on an error; restarting it")
                self._unmonitored_all("health monitoring restarting after an error")
                self._idle(1.0)
            finally:
                source.close()

    def _watch(self, source) -> None:
        self._sync_monitored(source)
        with self._lock:
            self._write_file()          # readers see a state from the start, change or not
        self._ready.set()
        retry_lost_at = time.monotonic() + LOST_RETRY
        while not self._stop.is_set():
            for raw in source.wait(self._timeout_ms()):
                self._on_raw(raw)
            if source.lost and time.monotonic() >= retry_lost_at:
                retry_lost_at = time.monotonic() + LOST_RETRY
                for raw in source.retry_lost():
                    self._on_raw(raw)
            self._sync_monitored(source)
            with self._lock:
                self._change("recovered", S.recover_due)
            if self.options.state_file:
                self._take_requests()

    def _timeout_ms(self) -> int:
        limit = self.options.wait_timeout_ms
        due = S.next_due(self.state)
        if due is not None:
            limit = min(limit, max(10, int((due - self.clock()) * 1000) + 1))
        return limit

    def _sync_monitored(self, source) -> None:
        """A (re)built event set watches these GPUs: they are monitored again."""
        if source.generation == self._generation:
            return
        self._generation = source.generation
        with self._lock:
            self._change("monitoring", lambda st, now: S.set_monitored(st, source.registered, now))

    def _take_requests(self) -> None:
        for request in clear_requests.pending_requests(self.host):
            try:
                update = self.clear(None if request.devices is None else list(request.devices))
            except HostagentError as e:
                clear_requests.answer(request, error=e)
                continue
            cleared = [d.name for d in update.changes] if update else []
            clear_requests.answer(request, cleared=cleared)

    def _idle(self, seconds: float) -> None:
        """Wait, still answering clear requests (with everything unmonitored)."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.options.state_file:
                self._take_requests()
            self._stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
