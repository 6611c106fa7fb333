"""The DRA kubelet plugin's loop: the agent followed, the pool published, the sockets kept.

- **The agent** (through ``AgentLink``): each new view recomputes the published devices
  (``devices.build_pool``), their taints (``taints``: NVIDIA's keys, from the agent's
  health, gone when it recovers) and their health. While the agent cannot be reached, or
  verifies its driver, the pool stays as it was (an agent restart changes nothing in the cluster);
  a driver that does not verify empties it (no device can be prepared then), and every
  device is Unknown or Unhealthy to the kubelet.
- **The API server** (a publishing thread): the pool's slices follow the devices; a failed
  write is retried with back-off; every ``resync`` seconds, at each registration and at
  every change of the pool's slices made by someone else (a kubelet deletes a node's slices
  when it starts), the slices are compared again.
- **The kubelet**: the DRA services and the registration socket are served again when their
  files are removed or replaced (a kubelet whose folders are re-created), which registers
  the plugin again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ... import model
from ...errors import HostagentError
from ..agentlink import AgentLink
from .devices import Pool, build_pool
from .health import UNHEALTHY, Board, Entry, device_health
from .errors import KubeError
from .prepare import PREFIX, Preparer, owned
from .publisher import Publisher
from .registrar import Registrar
from .service import DraServer
from .slices import layout
from .taints import for_server, tainted

__all__ = ["Options", "DraPlugin"]

log = logging.getLogger("hostagent.plugins")


@dataclass(frozen=True)
class Options:
    node: str
    registry_dir: Path
    plugin_dir: Path
    agent_socket: Path
    driver: str = "gpu.nvidia.com"
    dynamic_mig: bool = False
    passthrough: bool = False         # each GPU also as NVIDIA's vfio device
    no_execute: bool = False          # unrecoverable faults (XID 79, a lost GPU) taint NoExecute
    resync: float = 60.0                 # seconds between comparisons of the slices
    backoff: tuple[float, float] = (0.5, 30.0)
    poll: float = 0.5                    # how often the sockets are looked at
    heartbeat: float = 10.0              # health stream


class DraPlugin:
    def __init__(self, options: Options, api, notifier=None):
        self.options = options
        self.api = api
        self.notifier = notifier
        self.link = AgentLink(options.agent_socket)
        self.link.owned = owned             # its own allocations change no published device
        self.link.own_prefix = PREFIX       # and the agent need not send their device changes
        self.board = Board(options.heartbeat)
        self.pool: Pool | None = None            # what is published (None: not known yet)
        self.preparer = Preparer(self.link, api, options.driver, options.node, lambda: self.pool)
        self.server = DraServer(options.plugin_dir, self.preparer, self.board)
        self.registrar = Registrar(options.registry_dir, options.driver, self.server.socket,
                                   on_registered=self.kick)
        self.publisher = Publisher(api, options.driver, options.node)
        self.profiles: dict[str, list[dict]] = {}
        self._last_views: dict[str, dict] = {}   # uuid -> the agent's last view of it (a lost GPU's stays)
        self.version: tuple[int, int] | None = None
        self.published_error: str | None = None
        self._stop = threading.Event()
        self._dirty = threading.Event()
        self._view_changed = threading.Event()

    # ---- the devices --------------------------------------------------------------

    def _profiles(self, devices: dict) -> dict[str, list[dict]]:
        """MIG profiles of the MIG-mode GPUs (read once per GPU: they never change)."""
        wanted = {u for u, d in devices.items() if d["kind"] == "gpu" and model.mig_enabled(d)}
        if self.options.dynamic_mig and wanted - set(self.profiles):
            try:
                listing = self.link.client().devices(type="gpu", profiles=True)
                self.profiles.update({g["uuid"]: g["mig"].get("profiles") or [] for g in listing["gpus"]
                                      if g.get("mig")})
            except HostagentError as e:
                log.warning("MIG profiles not read: %s", e.message)
        return self.profiles

    def _driver_down(self, node: dict) -> str | None:
        """Why no device can be prepared now: a driver that does not verify, or is being
        changed; None while it verifies (or is being verified: the pool stays as it was)."""
        driver = node.get("driver") or {}
        if driver.get("state") in ("degraded", "maintenance") and not driver.get("ready"):
            return f"the GPU driver is {driver['state']}: {driver.get('reason') or 'see GET /v1/driver'}"
        return None

    def refresh(self) -> bool:
        """Recompute the devices and their health from the agent's view; True when the
        devices to publish changed."""
        view = self.link.view
        before = self.pool
        node = view.node
        if view.connected and not self._driver_down(node):
            # MIG devices made for this plugin's claims stand as the partitions they were made from.
            made = {u: (d["parent_uuid"], d["profile"], d["placement"]["start"]) for u, d in view.devices.items()
                    if d["kind"] == "mig" and owned(d.get("made_for") or "")}
            pool = build_pool(view.devices, self._profiles(view.devices), node, self.options.dynamic_mig, made,
                              self.options.passthrough)
            self._last_views.update(view.devices)
            pool = self._keep_lost(pool, before, view)
            pool = tainted(pool, {**self._last_views, **view.devices}, no_execute=self.options.no_execute)
            if pool.problems != (before.problems if before else ()):
                for problem in pool.problems:
                    log.warning("%s", problem)
            self.pool = pool
        elif view.connected:
            self.pool = Pool()
        published = [(d.name, d.health_of) for d in (self.pool.devices if self.pool else ())]
        entries = device_health(self.options.node, published, view.devices, view.connected)
        down = self._driver_down(node) if view.connected else None
        if down and before is not None:
            entries = [Entry(self.options.node, d.name, UNHEALTHY, down) for d in before.devices]
        self.board.set(entries)
        return self.pool != before

    def _keep_lost(self, pool: Pool, before: Pool | None, view) -> Pool:
        """``pool`` with the devices of a GPU that fell off the bus kept as they were: the
        agent's inventory leaves out a GPU NVML cannot read, but Kubernetes must see its
        devices tainted ``gpu-lost`` (and, with ``no_execute``, evict their pods). Kept while
        the agent counts an unreadable GPU and their last health said lost."""
        if before is None or not (view.node.get("unreadable_gpus") or 0):
            self._last_views = {u: v for u, v in self._last_views.items() if u in view.devices}
            return pool
        names = {d.name for d in pool.devices}
        kept = [d for d in before.devices if d.health_of not in view.devices and d.name not in names
                and any(p["kind"] == "gpu_lost" for p in
                        ((self._last_views.get(d.health_of) or {}).get("health") or {}).get("problems") or ())]
        if not kept:
            return pool
        have = {c.name for c in pool.counter_sets}
        wanted = {n for d in kept for n in d.counter_sets}
        sets = tuple(c for c in before.counter_sets if c.name in wanted and c.name not in have)
        return replace(pool, devices=pool.devices + tuple(kept), counter_sets=pool.counter_sets + sets)

    # ---- publishing ---------------------------------------------------------------

    def kick(self) -> None:
        """Compare the slices again soon (a registration, a change someone else made)."""
        self._dirty.set()

    def _specs(self) -> list[dict]:
        pool = self.pool
        if (pool.counter_sets or any(d.taints for d in pool.devices)) and self.version is None:
            self.version = self.api.server_version()
        version = self.version or (1, 34)
        pool = for_server(pool, version, taken=not self.publisher.taints_dropped)
        return layout(pool, self.options.driver, self.publisher.pool, self.options.node, version)

    def _publishing(self) -> None:
        delay = self.options.backoff[0]
        next_resync = 0.0
        while not self._stop.is_set():
            self._dirty.wait(max(0.0, min(next_resync - time.monotonic(), self.options.resync)))
            if self._stop.is_set():
                return
            self._dirty.clear()
            if self.pool is None:
                next_resync = time.monotonic() + self.options.resync
                continue
            if self.publisher.owner_uid is None:          # the slices' owner, the Node (till it is read)
                self.publisher.owner_uid = self.api.node_uid(self.options.node)
            try:
                self.publisher.sync(self._specs())
                self.published_error = None
                delay = self.options.backoff[0]
                next_resync = time.monotonic() + self.options.resync
            except KubeError as e:
                if self.published_error != e.message:
                    log.warning("slices not published (%s); again in %g s", e.message, delay)
                self.published_error = e.message
                self._stop.wait(delay)
                delay = min(delay * 2, self.options.backoff[1])
                self._dirty.set()

    def _watching(self) -> None:
        """Changes of the pool's slices by others: compare again (our own writes compare equal)."""
        delay = self.options.backoff[0]
        while not self._stop.is_set():
            try:
                for _kind, _obj in self.api.watch_slices(self.options.driver, self.options.node):
                    if self._stop.is_set():
                        return
                    self.kick()
                    delay = self.options.backoff[0]
            except KubeError as e:
                log.debug("watching slices: %s", e.message)
            self._stop.wait(delay)
            delay = min(delay * 2, self.options.backoff[1])

    # ---- the loop -------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._view_changed.set()

    def _thread(self, target, name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        return t

    def run(self) -> int:
        self.link.listeners.append(lambda view: self._view_changed.set())
        self.link.start()
        self.server.start()
        self.registrar.start()
        threads = [self._thread(self._publishing, "dra-publish"), self._thread(self._watching, "dra-watch")]
        if self.notifier:
            self.notifier.ready(self.status())
        try:
            while not self._stop.is_set():
                changed = self._view_changed.wait(self.options.poll)
                self._view_changed.clear()
                if changed and self.refresh():
                    self.kick()
                self._sockets()
                self._report()
        finally:
            if self.notifier:
                self.notifier.stopping()
            self.link.stop()
            self.board.stop()
            self.registrar.stop()
            self.server.stop()
            for t in threads:
                t.join(timeout=2.0)
        return 0

    def _sockets(self) -> None:
        if not self.server.intact:
            log.info("the DRA service socket %s is gone: serving it again", self.server.socket)
            self.server.restart()
            self.registrar.restart()
        elif not self.registrar.intact:
            log.info("the registration socket %s is gone: serving it again", self.registrar.socket)
            self.registrar.restart()

    # ---- status -----------------------------------------------------------------------

    def status(self) -> str:
        view = self.link.view
        agent = "agent connected" if view.connected else f"agent not reachable: {view.error}"
        devices = len(self.pool.devices) if self.pool else 0
        kubelet = "registered" if self.registrar.registered else (self.registrar.error or "not registered")
        api = f"slices: {self.published_error}" if self.published_error else \
            f"pool generation {self.publisher.generation}"
        return f"{agent}; {devices} device(s); {kubelet}; {api}"

    def _report(self) -> None:
        if self.notifier is not None:
            self.notifier.status_changed(self.status())
