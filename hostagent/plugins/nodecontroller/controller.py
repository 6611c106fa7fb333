"""The node controller's loop: the Node watched, the agent followed, the files looked at.

    NodeWatcher ─┐                      ┌─ MigByLabel      (state label, Events, apply)
    AgentLink ───┼─ wake ─ the loop ────┤
    files ───────┘                      └─ SharingByLabel  (state label, Events, apply)
    AgentLink ── health events, views ─── HealthReporter   (Events, condition, taint)
    ConfigMap, Leases, Node, AgentLink ── DriverUpgrade     (the fleet's driver version, a slot, the walk)

A pass runs when something it reads changed: the Node's labels, the agent's view (its
devices, their allocations, a reconnect), the files named on the command line. Nothing is
polled on the API server; the files are looked at every ``files_poll`` seconds (a ``stat``).
Health and driver upgrades run on threads of their own.
"""

from __future__ import annotations

import logging
import threading
import time

from ..agentlink import AgentLink
from ..kubeerror import KubeError
from .configs import Watched, read_mig_file
from .context import Context, Options
from .events import WARNING, EventRecorder
from .health import HealthReporter
from .keys import COMPONENT, MIG_CONFIG, SHARING_CONFIG
from .mig import MigByLabel
from .sharing import SharingByLabel
from .upgrade import DriverUpgrade
from .watcher import NodeWatcher
from .writer import NodeWriter

__all__ = ["NodeController", "Options"]

log = logging.getLogger("hostagent.plugins")

FILE_EVENT = "NodeControllerConfigInvalid"


class NodeController:
    def __init__(self, options: Options, api, notifier=None):
        self.options = options
        self.notifier = notifier
        self.stop_event = threading.Event()
        self._wake = threading.Event()
        self.link = AgentLink(options.agent_socket)
        self.link.types = (*self.link.types, "health_event")
        self.writer = NodeWriter(api, options.node)
        self.recorder = EventRecorder(api, options.node, options.namespace, COMPONENT,
                                      node_uid=lambda: ((self.writer.node or {}).get("metadata") or {}).get("uid"))
        self.ctx = Context(options, api, self.link, self.writer, self.recorder, self.stop_event)
        self.watcher = NodeWatcher(api, options.node, self._node_changed, options.backoff)
        self.mig_file = Watched(options.mig_config)
        self.sharing_files = Watched(options.sharing_configs, folder=True)
        self.mig = MigByLabel(self.ctx, read_mig_file(options.mig_config))
        self.mig_file.changed()
        self.sharing_files.changed()
        self.sharing = SharingByLabel(self.ctx)
        self.health = HealthReporter(self.ctx)
        self.upgrade = DriverUpgrade(self.ctx)
        self._labels: tuple | None = None
        self._retry_at: float | None = None         # a pass the API server failed: when to try again
        self._delay = options.backoff[0]

    # ---- wake-ups ---------------------------------------------------------------------

    def _node_changed(self, node: dict | None) -> None:
        self.writer.seen(node)
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        wanted = (labels.get(MIG_CONFIG), labels.get(SHARING_CONFIG))
        if wanted != self._labels or self.ctx.cordon.lifted():     # the latter: forgotten on the loop
            self._labels = wanted
            self._wake.set()
        self.health.wake()
        self.upgrade.wake()

    def _view_changed(self, view) -> None:
        self._wake.set()
        self.health.wake()
        self.upgrade.wake()

    def _files(self) -> bool:
        changed = False
        if self.mig_file.changed():
            self.mig.reload(read_mig_file(self.options.mig_config))
            log.info("MIG config file %s read again", self.options.mig_config)
            changed = True
        if self.sharing_files.changed():
            self.sharing.reload()
            log.info("sharing configs in %s read again", self.options.sharing_configs)
            changed = True
        if changed and self.mig.file.problem:
            self.recorder.record(WARNING, FILE_EVENT, self.mig.file.problem)
        return changed

    # ---- the loop ---------------------------------------------------------------------

    def _pass(self) -> None:
        node = self.writer.node
        if node is None:
            return
        labels = (node.get("metadata") or {}).get("labels") or {}
        failed = False
        for reconcile in (lambda _: self.ctx.cordon.forget_lifted(), self.mig.reconcile, self.sharing.reconcile):
            try:
                reconcile(labels)
            except KubeError as e:
                log.warning("%s; trying again in %g s", e.message, self._delay)
                failed = True
        if failed:
            self._retry_at = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, self.options.backoff[1])
        else:
            self._retry_at, self._delay = None, self.options.backoff[0]

    def stop(self) -> None:
        self.stop_event.set()
        self._wake.set()
        self.watcher.stop()
        self.upgrade.stop()
        self.link.stop()

    def run(self) -> int:
        if self.mig.file.problem:
            log.error("%s", self.mig.file.problem)
            self.recorder.record(WARNING, FILE_EVENT, self.mig.file.problem)
        self.link.listeners.append(self._view_changed)
        self.link.event_listeners.append(self.health.on_event)
        self.link.start()
        self.watcher.start()
        self.health.start()
        self.upgrade.start()
        if self.notifier:
            self.notifier.ready(self.status())
        try:
            while not self.stop_event.is_set():
                wait = self.options.files_poll
                if self._retry_at is not None:
                    wait = max(0.0, min(wait, self._retry_at - time.monotonic()))
                woke = self._wake.wait(wait)
                self._wake.clear()
                if self.stop_event.is_set():
                    break
                retry = self._retry_at is not None and time.monotonic() >= self._retry_at
                if self._files() or woke or retry or self.mig.due or self.sharing.due:
                    self._pass()
                self._report()
        finally:
            if self.notifier:
                self.notifier.stopping()
            self.stop()
            self.recorder.close()
        return 0

    # ---- status ---------------------------------------------------------------------

    def status(self) -> str:
        view = self.link.view
        agent = "agent connected" if view.connected else f"agent not reachable: {view.error}"
        api = "watching the Node" if self.watcher.connected else f"API server: {self.watcher.error}"
        upgrade = self.upgrade.status()
        return f"{agent}; {api}" + (f"; {upgrade}" if upgrade else "")

    def _report(self) -> None:
        if self.notifier is not None:
            self.notifier.status_changed(self.status())
