"""The daemon's GPU sharing: the configuration in force restored at start (MPS daemons still
running are adopted, not restarted), MPS control daemons supervised, ``GET``/``PUT
/v1/sharing``, ``sharing_changed`` events, and MPS daemons stopped around MIG changes.

Supervision: a daemon whose process exits is noticed within a second; every
``sharing.probe_interval`` seconds each daemon is asked ``get_default_active_thread_percentage``
through its pipe (the device plugin's probe, which it runs once, at start), and two probes in
a row without an answer within ``sharing.probe_timeout`` count as down. A down daemon is
restarted after ``sharing.restart_backoff`` seconds, doubled after each restart that fails,
up to ``sharing.restart_backoff_max``. Every node change goes through ``sharing.service`` on
the agent's worker thread, under the agent's mutex and the node lock, as MIG changes do.

The driver's readiness gate decides when daemons may start (``gate``): until the driver
verifies they wait, and say why; a driver install (the gate's maintenance) stops them, and
they start again once the new driver verifies. The daemons outlive the agent: a stop or
restart of hostagentd leaves them serving their clients, and the next start adopts them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass

from ..errors import ConfigError, HostagentError

__all__ = ["SharingOps", "Watch"]

log = logging.getLogger("hostagent.daemon")

PERIOD = 1.0                # seconds between liveness checks (a pid that vanished)
PROBE_FAILURES = 2          # failed probes in a row that make a daemon down


@dataclass
class Watch:
    """One supervised MPS daemon."""
    uuid: str
    label: str
    gpu_uuid: str
    state: str = "starting"          # starting | ready | down | waiting
    reason: str | None = None
    since: float = 0.0
    pid: int | None = None
    process: object = None           # processes.ProcessRecord of the daemon, from the sharing state
    failures: int = 0                # probes failed in a row
    attempts: int = 0                # restarts failed in a row
    next_restart: float | None = None     # monotonic time of the next restart
    restarts: int = 0

    def view(self) -> dict:
        out = {"state": self.state, "reason": self.reason, "since": round(self.since, 3), "pid": self.pid,
               "restarts": self.restarts}
        if self.state == "down" and self.next_restart is not None:
            out["next_restart_in"] = round(max(0.0, self.next_restart - time.monotonic()), 3)
        return out


class SharingOps:
    def __init__(self, agent):
        self.agent = agent
        self.host = agent.host
        self.watches: dict[str, Watch] = {}
        self.waiting: str | None = None      # why daemons wait, if they do
        self.view: dict = {"config": None, "strategies": [], "devices": [], "gpus": [], "waiting": None}
        self.paused = False                  # a MIG change is under way: no restarts meanwhile
        self._next_probe = 0.0
        self._started = False

    # ---- settings and the gate ----------------------------------------------------

    def _setting(self, key: str) -> float:
        return (self.agent.settings.sections.get("sharing") or {}).get(key) or {
            "probe_interval": 10.0, "probe_timeout": 5.0, "restart_backoff": 1.0, "restart_backoff_max": 60.0}[key]

    def gate(self) -> str | None:
        """Why MPS daemons may not start now; None when they may: the driver's readiness
        gate (a daemon started on a driver that does not verify would fail, or hold the GPUs
        a driver install must unload), then an inventory to resolve the configuration with."""
        if not self.agent.driver.ready:
            return self.agent.driver.why
        error = self.agent.inventory_error
        if error is not None:
            return f"NVML cannot be used: {error.message}"
        if self.agent.inventory is None:
            return "the inventory has not been read yet"
        return None

    # ---- start, reconcile, apply ------------------------------------------------------

    async def start(self) -> None:
        """At daemon start: restore the configuration in force (adopting daemons that still
        answer); later, whenever the node's devices change."""
        self.agent.inventory_listeners.append(self._inventory_changed)
        self.agent.driver.add_listener(self._driver_changed)
        self._started = True
        await self.reconcile("start")

    def _driver_changed(self, ready: bool) -> None:
        """Gate listener (loop thread): the daemons that waited start once the driver verifies."""
        if ready and self._started:
            asyncio.get_running_loop().create_task(self.reconcile("driver ready"))

    async def stop_daemons(self, reason: str) -> None:
        """Stop every MPS daemon (a driver install needs the GPUs free); the configuration
        stays, and the daemons start again once the driver verifies."""
        from ..sharing.service import pause
        from ..sharing.state import SharingState
        async with self.agent.mutex:
            state = await self.agent.blocking(SharingState.load, self.host)
            mps_devices = [u for u, d in state.devices.items() if d.strategy == "mps"]
            if not mps_devices:
                return
            stopped = await self.agent.blocking(pause, self.host, mps_devices)
            if stopped:
                log.warning("MPS daemons of %s stopped: %s", ", ".join(stopped), reason)
            self.waiting = self.gate() or reason
            for w in self.watches.values():
                w.state, w.reason, w.pid, w.process = "waiting", self.waiting, None, None
                self.agent.metrics.mps_daemon(w.uuid, False, w.restarts)
            await self._publish("waiting")

    def _inventory_changed(self, inventory) -> None:
        """Agent listener (loop thread): a MIG change, a GPU lost or back, the driver back."""
        if self._started and not self.paused:
            asyncio.get_running_loop().create_task(self.reconcile("devices changed"))

    async def reconcile(self, reason: str) -> None:
        async with self.agent.mutex:
            await self.reconcile_locked(reason)

    def _anything(self) -> bool:
        """Is anything shared, or left to undo? (Else there is nothing to restore or reload.)"""
        from ..sharing.config import config_path
        from ..sharing.state import state_path
        return bool(self.watches) or config_path(self.host).exists() or state_path(self.host).exists()

    async def reconcile_locked(self, reason: str) -> None:
        """Bring the node to the configuration in force; never fatal."""
        from ..sharing.config import config_path
        if not self._anything():
            return
        why = self.gate()
        if why is not None:
            if self.waiting != why and config_path(self.host).exists():
                log.warning("MPS daemons wait (%s): %s", reason, why)
            self.waiting = why
            for w in self.watches.values():
                w.state, w.reason = "waiting", why
            await self._publish("waiting")
            return
        self.waiting = None
        try:
            outcome = await self._run(None)
        except HostagentError as e:
            log.error("sharing configuration not restored (%s): %s", reason, e.message)
            await self._publish("error")
            return
        if outcome.recovered:
            log.warning("sharing: %s", outcome.recovered)
        for problem in outcome.plan.desired.problems:
            log.warning("sharing: %s", problem)
        if reason == "start":
            for warning in outcome.warnings:
                log.warning("sharing configuration: %s", warning)
        if outcome.plan.steps:
            log.info("sharing restored (%s): %d step(s)", reason, len(outcome.plan.steps))
        await self._publish(reason)

    async def _run(self, config, *, dry_run: bool = False, only: set[str] | None = None,
                   persist: bool = True, force: bool = False):
        """The service's apply on the worker thread (the agent's mutex held); the watches
        follow the outcome. ``force``: devices in allocations may change too."""
        from ..sharing import service
        fn = functools.partial(service.apply, self.host, config, dry_run=dry_run, only=only,
                               allocations=[] if force else list(self.agent.allocations.values()),
                               persist=persist)
        outcome = await self.agent.blocking(fn)
        if not dry_run:
            await self._follow(outcome)
        return outcome

    async def apply(self, body: dict) -> dict:
        """``PUT /v1/sharing``: ``config`` a document (None: off), ``dry_run``, ``force``."""
        from ..sharing.config import EMPTY, parse
        config = EMPTY if body.get("config") is None else parse(body["config"], "the sharing configuration")
        dry_run = bool(body.get("dry_run"))
        for warning in config.warnings:
            log.warning("sharing configuration: %s", warning)
        async with self.agent.mutex:
            why = self.gate()
            if why is not None and not dry_run and not config.empty:
                from ..errors import UnavailableError
                raise UnavailableError(f"MPS daemons cannot start now: {why}", hint="see GET /v1/node")
            outcome = await self._run(config, dry_run=dry_run, force=bool(body.get("force")))
            if not dry_run:
                failed = outcome.report.failed if outcome.report else []
                if outcome.recovered:
                    log.warning("sharing: %s", outcome.recovered)
                if outcome.rolled_back is not None:
                    log.error("sharing configuration not applied, rolled back: %d of %d step(s) failed (%s)",
                              len(failed), len(outcome.plan.steps), failed[0].error)
                else:
                    log.info("sharing configuration %s: %d step(s)", "removed" if config.empty else "applied",
                             len(outcome.plan.steps))
                await self._publish("rolled_back" if outcome.rolled_back is not None
                                    else "off" if config.empty else "applied")
        return {**outcome.to_dict(), "revision": self.agent.events.revision}

    async def reload(self) -> None:
        """SIGHUP: the configuration file may have been edited; apply it as it is now."""
        from ..sharing.config import load_persisted
        if self.gate() is not None or not self._anything():
            return
        async with self.agent.mutex:
            try:
                config = await self.agent.blocking(load_persisted, self.host)
                await self._run(config, persist=False)
            except HostagentError as e:
                log.error("sharing configuration not reloaded, what is in force stays: %s", e.message)
                return
            await self._publish("reload")

    # ---- watches --------------------------------------------------------------------

    async def _follow(self, outcome) -> None:
        """Watches for the daemons the state now records (loop thread)."""
        from ..sharing.state import SharingState
        state = await self.agent.blocking(SharingState.load, self.host)
        failed = {r.step.target: r.error for r in (outcome.report.failed if outcome.report else [])
                  if r.step.action == "start_daemon"}
        now = time.time()
        started = {s.target for s in outcome.plan.steps if s.action == "start_daemon"}
        wanted = {u: d for u, d in state.devices.items() if d.strategy == "mps"}
        for uuid in list(self.watches):
            if uuid not in wanted:
                self.watches.pop(uuid)
                self.agent.metrics.mps_daemon_gone(uuid)
        for uuid, d in wanted.items():
            w = self.watches.get(uuid)
            if w is None:
                w = self.watches[uuid] = Watch(uuid, d.label, d.gpu_uuid, since=now)
            record = state.daemons.get(uuid)
            if w.state == "starting" and uuid not in started and record is not None:
                log.info("MPS daemon of %s adopted (pid %s): it was running and answers", w.label, record.pid,
                         extra={"fields": {"device": uuid}})
            if uuid in failed:
                self._down(w, failed[uuid], restart_failed=True)
            elif record is not None:
                if w.state != "ready":
                    w.state, w.reason, w.since = "ready", None, now
                w.pid, w.process, w.failures, w.attempts, w.next_restart = record.pid, record.known, 0, 0, None
                w.restarts = max(w.restarts, record.restarts)
            elif outcome.plan.desired.daemons.get(uuid) is not None:
                self._down(w, "no daemon of its runs")
            else:
                self._down(w, "its device is not on the node now")
            self.agent.metrics.mps_daemon(uuid, w.state == "ready", w.restarts)

    def _down(self, w: Watch, reason: str, restart_failed: bool = False) -> None:
        """Mark ``w`` down and schedule its restart: ``restart_backoff`` seconds, doubled after
        each restart that failed, at most ``restart_backoff_max``."""
        if restart_failed:
            w.attempts += 1
        elif w.state == "down":
            return
        delay = min(self._setting("restart_backoff") * 2 ** w.attempts, self._setting("restart_backoff_max"))
        if restart_failed:
            log.warning("MPS daemon of %s did not start: %s; next try in %gs", w.label, reason, delay,
                        extra={"fields": {"device": w.uuid}})
        elif w.state != "down":
            log.warning("MPS daemon of %s down: %s; restarting in %gs", w.label, reason, delay,
                        extra={"fields": {"device": w.uuid}})
        w.state, w.reason, w.since = "down", reason, time.time()
        w.failures, w.next_restart = 0, time.monotonic() + delay
        self.agent.metrics.mps_daemon(w.uuid, False, w.restarts)

    # ---- supervision ------------------------------------------------------------------

    async def supervise(self) -> None:
        while True:
            await asyncio.sleep(PERIOD)
            try:
                await self.check()
            except Exception:               # a bug: say so, keep supervising
                log.exception("MPS supervision check failed")

    async def check(self) -> None:
        """One round of supervision. What it finds is judged under the agent's mutex: a change
        under way (an apply, an off, a MIG change) stops and starts daemons itself, and its
        watches are the ones that count after it."""
        if self.paused or self.agent.mutex.locked():
            return
        why = self.gate()
        if why is not None:
            if self.watches and self.waiting != why:
                async with self.agent.mutex:
                    self.waiting = why
                    for w in self.watches.values():
                        w.state, w.reason = "waiting", why
                    log.warning("MPS daemons wait: %s", why)
                    await self._publish("waiting")
            return
        if self.waiting is not None:         # the driver is back: start what waited
            await self.reconcile("driver ready")
            return
        ready = [(w, w.process) for w in self.watches.values() if w.state == "ready"]
        if ready:
            await self._judge(ready)
        for w in [w for w in self.watches.values() if w.state == "down" and w.next_restart is not None
                  and w.next_restart <= time.monotonic()]:
            await self._restart(w)

    async def _judge(self, ready) -> None:
        """Which of the ``ready`` daemons exited, or stopped answering (probed every
        ``probe_interval``): marked down."""
        from ..processes import current
        answers = None
        now = time.monotonic()
        if now >= self._next_probe:
            self._next_probe = now + self._setting("probe_interval")
            answers = await asyncio.to_thread(self._probe, [w.uuid for w, _ in ready], self._setting("probe_timeout"))
        async with self.agent.mutex:
            changed = False
            for w, process in ready:
                if self.watches.get(w.uuid) is not w or w.state != "ready" or w.process != process:
                    continue                 # a change replaced or restarted it meanwhile
                if not current(process):
                    self._down(w, "the daemon exited")
                    changed = True
                elif answers is None:
                    continue                 # no probe this round
                elif answers.get(w.uuid):
                    w.failures = 0
                else:
                    w.failures += 1
                    if w.failures >= PROBE_FAILURES:
                        self._down(w, f"it did not answer {w.failures} probes in a row")
                        changed = True
            if changed:
                await self._publish("daemon_down")

    def _probe(self, uuids: list[str], timeout: float) -> dict[str, bool]:
        """Each daemon asked through its pipe (a front end with a timeout: nothing here
        reads a file clients use, nor can block)."""
        from concurrent.futures import ThreadPoolExecutor

        from ..sharing import mps
        with ThreadPoolExecutor(min(8, len(uuids))) as pool:
            return dict(zip(uuids, pool.map(lambda u: mps.probe(self.host, u, timeout), uuids)))

    async def _restart(self, w: Watch) -> None:
        async with self.agent.mutex:
            if w.state != "down" or self.paused:
                return
            try:
                outcome = await self._run(None, only={w.uuid, w.gpu_uuid})
            except HostagentError as e:
                self._down(w, e.message, restart_failed=True)
                await self._publish("daemon_down")
                return
            if w.state == "ready":               # the state's record counted the restart
                self.agent.metrics.mps_daemon(w.uuid, True, w.restarts, restarted=True)
                log.info("MPS daemon of %s restarted (pid %s)", w.label, w.pid, extra={"fields": {"device": w.uuid}})
                await self._publish("daemon_restarted")
            elif outcome.report is not None and not outcome.report.failed:
                await self._publish("daemon_down")

    # ---- the view -------------------------------------------------------------------

    def devices(self) -> dict[str, dict]:
        """uuid -> its entry of the view, for the device views (loop thread)."""
        return {d["uuid"]: d for d in self.view.get("devices", ())}

    async def _publish(self, reason: str) -> None:
        """Rebuild the ``GET /v1/sharing`` view; publish ``sharing_changed`` if it changed,
        and the devices with it. The agent's mutex is held, so the devices and labels are
        published before the change that called this answers."""
        from ..sharing.service import status
        daemons = {u: w.view() for u, w in self.watches.items()}
        inventory = self.agent.inventory
        try:
            view = await self.agent.blocking(functools.partial(status, self.host, inventory, daemons))
        except (HostagentError, ConfigError) as e:
            log.error("sharing status unavailable: %s", e.message)
            return
        view["waiting"] = self.waiting
        if _comparable(view) == _comparable(self.view):
            self.view = view
            return
        before, self.view = self.view, view
        self.agent.events.publish("sharing_changed", {"reason": reason, "sharing": view})
        if _labelled(before) != _labelled(view):
            await self.agent.refresh_locked("sharing")     # the node labels follow the sharing
        else:
            self.agent.publish()


def _labelled(view: dict) -> list:
    """What of the view the node labels show: the devices' sharing, and the configuration's
    MIG strategy (``nodelabels.mig_strategy``)."""
    flags = ((view.get("config") or {}).get("document") or {}).get("flags") or {}
    return [flags.get("migStrategy")] + [(d["uuid"], d["strategy"], d["replicas"], d["rename"])
                                         for d in view.get("devices", ())]


def _comparable(view: dict) -> dict:
    """A view without what moves by itself (times to the next restart)."""
    def strip(d):
        m = d.get("mps")
        return {**d, "mps": {k: v for k, v in m.items() if k != "next_restart_in"}} if m else d
    return {**view, "devices": [strip(d) for d in view.get("devices", [])]}
