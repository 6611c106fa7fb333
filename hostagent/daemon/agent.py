"""The agent: the node's state in one place, changed by one writer, published as events.

Imperative shell around the pure modules: blocking work (NVML, spec and checkpoint writes,
the node lock) runs on one worker thread, but for a commit that only appends to the
checkpoint (``commit``); state is replaced and events published on the
event loop's thread only, so readers never see a half-made change and need no locks.
Mutations are serialised by an asyncio lock and take the node lock around their writes, so
the CLI acting directly never interleaves with the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import __version__
from .. import model
from ..cdi import transient
from ..errors import HostagentError, StateError
from ..hostroot import HostRoot
from ..lock import node_lock
from . import allocations as alloc_rules
from .. import faults
from . import checkpoint
from .events import EventLog, RevisionClock
from .health import Health, unmonitored
from .liveness import DEFAULT
from .settings import Settings
from .state import Snapshot, diff_devices, lookup_table
from .views import BaseViews, device_views

__all__ = ["Agent", "QUICK_COMMIT", "SLOW_PAUSE"]

log = logging.getLogger("hostagent.daemon")

QUICK_COMMIT = 0.02         # seconds: a commit on the loop slower than this sends the next ones
SLOW_PAUSE = 10.0           # to the worker for this long


class Agent:
    def __init__(self, host: HostRoot, settings: Settings):
        self.host = host
        self.settings = settings
        self.started = time.time()
        # Set at SIGTERM (from the loop's thread): a MIG apply under way on the worker thread
        # rolls back before its next GPU instead of running to the end.
        self.stop_requested = threading.Event()
        self.events = EventLog(RevisionClock(host.state_dir / "revision"), settings.api.watch_buffer)
        self.default_health = unmonitored(self.started)
        self.health: dict[str, Health] = {}
        self.inventory = None
        self.inventory_error: HostagentError | None = None
        self.spec = None                  # the node spec's GeneratedSpec
        self.spec_options = None
        self._spec_file = (None, None)    # (spec_options, the node spec's path) as last shown
        self.cdi_names: dict[str, tuple[str, ...]] = {}
        self._allocations: dict[str, alloc_rules.Allocation] = {}
        self.making: dict[str, str] = {}  # MIG device uuid -> the allocation it is being made for
        self.profiles: dict[str, list[dict]] = {}   # GPU uuid -> its MIG profile views
        self._users = None                # users(), until the allocations change
        self._base_views = BaseViews()    # the inventory's part of the device views
        self.links = None                 # topology.ranking.Links of the inventory's GPUs
        self.snapshot = Snapshot(self.events.revision, {}, {}, [], {}, {})
        self._pending_publish = None      # [events, allocations_only] of the queued publish_soon
        self._restore_pending = False     # checkpoint loaded, not yet checked against the inventory
        self.labels = None                # nodelabels.LabelResult of the last inventory read
        self.checkpoint_damage: list = []  # checkpoint.Unreadable records not yet dismissed
        self.vfio = None                  # the PCI bus's GPUs and VFIO facts (passthrough.read_bus)
        # Called on the loop's thread with each inventory that differs from the last (the
        # health monitor and the metrics sampler follow MIG changes), before it is published.
        self.inventory_listeners: list = []
        # Called on the loop's thread after each publish (the daemon keeps systemd's STATUS
        # current); each must be cheap when nothing it shows changed.
        self.publish_listeners: list = []
        from ..metrics.agent import AgentMetrics
        self.metrics = AgentMetrics()     # API, MIG, CDI and health counters
        from .driver import DriverGate
        self.driver = DriverGate(self)    # the driver readiness gate (daemon/driver.py)
        from .driverinstall import DriverInstalls
        self.driver_installs = DriverInstalls(self)     # installs asked through the API
        self.health_link = None           # healthlink.HealthLink, metricslink.MetricsLink:
        self.metrics_link = None          # made and started by the daemon after the reconcile
        self.features = None              # features.Features: their lifecycle (set by the daemon)
        from .allocator import Allocator
        from .mig import MigOps
        from .passthrough import PassthroughOps
        from .sharing import SharingOps
        self.allocator = Allocator(self)
        self.passthrough = PassthroughOps(self)
        self.mig = MigOps(self)
        self.sharing = SharingOps(self)
        from .liveness import TimedLock, WorkClock
        self.mutex = TimedLock()
        self.work = WorkClock(settings.daemon.work_timeout)    # what the worker runs: for the liveness probe
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="hostagent-worker")
        self._loop_commits_after = 0.0    # time.monotonic() before which commits go to the worker

    # ---- plumbing ---------------------------------------------------------------

    async def blocking(self, fn, *args, budget=DEFAULT):
        """Run ``fn`` on the worker thread (NVML and file writes never block the loop); a
        call running past ``budget`` seconds (``daemon.work_timeout`` by default) makes the
        agent not live (``liveness``)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, self.work.timed(fn, budget), *args)

    async def commit(self, fn, *args, purpose: str, on_loop: bool):
        """Run a commit ``fn`` (it takes the node lock for ``purpose``, writes the checkpoint
        and waits for its fdatasync: a fraction of a millisecond) on the loop when
        ``on_loop`` (it does no other I/O) and it need not wait: the worker's hand-off and
        wake-ups cost more than such a commit. It goes to the worker when another process
        holds the node lock, and for ``SLOW_PAUSE`` seconds after a commit on the loop took
        longer than ``QUICK_COMMIT`` (a slow disk never holds up the loop for long)."""
        if on_loop and not faults.HANGS and time.monotonic() >= self._loop_commits_after:
            with contextlib.ExitStack() as held:
                try:
                    held.enter_context(node_lock(self.host, purpose, timeout=0))
                except StateError:
                    pass                        # another writer holds the node: wait on the worker
                else:
                    started = time.monotonic()
                    try:
                        return self.work.timed(fn)(*args)
                    finally:
                        took = time.monotonic() - started
                        if took > QUICK_COMMIT:
                            self._loop_commits_after = time.monotonic() + SLOW_PAUSE
                            log.info("a commit took %.0f ms: commits run on the worker for %g s", took * 1e3,
                                     SLOW_PAUSE)
        return await self.blocking(fn, *args)

    def let_go_of_gpus(self, why: str):
        """An async context in which the agent holds no GPU open through NVML (the monitor
        and the sampler paused: ``Features.let_go``), for a GPU leaving the nvidia driver or
        coming back to it. Nothing to let go before they start."""
        if self.features is None:
            return contextlib.nullcontext()
        return self.features.let_go(why)

    def stuck(self) -> str | None:
        """Why the agent's work does not move (None: it does): the liveness probe's answer."""
        return self.work.stuck(self.mutex)

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    def hook_home(self):
        """The hook program's interpreter and import path as the host runs them, and whether
        CDI specs start it (``load_settings`` refused a setting this node may not have)."""
        from ..cdi.hookhome import hook_home
        hook = self.settings.sections.get("hook") or {}
        return hook_home(self.host, hook.get("interpreter"), in_specs=hook.get("in_cdi_specs", True))

    # ---- inventory and the node spec ------------------------------------------------

    def _read(self):
        """Worker: read the inventory, refresh the node spec and the node labels (each file
        written only if its content changed)."""
        from ..devices import read_inventory
        from .nodelabels import LabelSettings, compute_and_write
        inventory = read_inventory(self.host)
        # Always regenerated (a few ms): the file is rewritten only when its content differs,
        # which also restores a spec (or a labels file) someone deleted.
        options, change, generated = self.refresh_cdi(inventory)
        labels = compute_and_write(self.host, inventory, LabelSettings.from_sections(self.settings.sections))
        return inventory, generated, options, change, labels, self._links_for(inventory), self.passthrough.read_bus()

    def _links_for(self, inventory):
        """Worker: how the inventory's GPUs are connected, for allocations: the one in use
        while the topology is the same, else a new one, searched ahead of the first request."""
        from ..topology.ranking import Links
        links = self.links
        if links is not None and links.key == Links.key_of(inventory):
            return links
        links = Links.of(inventory)
        links.warm()
        return links

    def refresh_cdi(self, inventory=None):
        """Worker: regenerate the node's CDI spec (written only if it changed), counted in
        the metrics; (options, change, generated)."""
        from ..cdi import refresh
        from ..cdi.spec import SpecOptions
        home = self.hook_home()
        options = SpecOptions(hook_interpreter=home.spec_interpreter, hook_import_path=home.import_path)
        held = not self.driver.ready         # no spec is written until the driver verifies
        try:
            change, generated = refresh.refresh(self.host, options, inventory=inventory, dry_run=held)
        except HostagentError:
            self.metrics.cdi_refresh("failed")
            raise
        if held and change.written:
            log.warning("CDI spec not written (%s)", self.driver.why)
            self.metrics.cdi_refresh("held")
            return options, None, generated
        self.metrics.cdi_refresh("written" if change.written else "unchanged")
        return options, change, generated

    def _cdi_names(self, inventory, generated, options) -> dict[str, tuple[str, ...]]:
        from ..cdi.naming import device_name
        present = set(generated.device_names)
        out = {}
        for gpu in inventory.gpus:
            for dev in (gpu, *(gpu.mig.devices if gpu.mig else ())):
                out[dev.uuid] = tuple(f"{options.kind}={device_name(dev, s)}"
                                      for s in options.name_strategies
                                      if device_name(dev, s) in present and not
                                      (dev is gpu and gpu.mig_enabled))
        return out

    async def refresh(self, reason: str) -> int:
        """Re-read the inventory (verifying the driver first while it does not verify);
        publish what changed. Returns the revision."""
        if not self.driver.ready:
            await self.driver.verify(reason)
        async with self.mutex:
            await self.refresh_locked(reason)
        return self.events.revision

    async def verify_driver(self, reason: str) -> None:
        """Verify the driver; once it verifies again, re-read the node (the CDI spec and
        the allocations wait for that)."""
        was_ready = self.driver.ready
        await self.driver.verify(reason)
        if self.driver.ready and not was_ready:
            await self.refresh(reason)

    async def refresh_locked(self, reason: str) -> None:
        if self.driver.maintenance is not None:
            return                 # a driver install runs: NVML is left alone
        try:
            inventory, generated, options, change, labels, links, vfio = await self.blocking(self._read)
        except HostagentError as e:
            if self.inventory_error is None or self.inventory_error.message != e.message:
                log.error("cannot read the inventory (%s): %s", reason, e.message,
                          extra={"fields": {"error_code": e.code}})
            self.inventory_error = e
            self.publish()
            return
        if self.inventory_error is not None:
            log.info("inventory readable again")
        self.inventory_error = None
        if change is not None and change.written:
            log.info("CDI spec %s", change.describe(), extra={"fields": {"reason": reason}})
        for problem in generated.problems:
            log.warning("CDI: %s", problem.message)
        if labels.error and (self.labels is None or self.labels.error != labels.error):
            log.error("node labels: %s", labels.error)
        before = []
        if self.labels is None or self.labels.labels != labels.labels:
            before.append(("labels_changed", {"labels": labels.labels}))
        self.labels = labels
        previous, self.inventory, self.spec, self.spec_options = self.inventory, inventory, generated, options
        self.vfio = vfio
        if links is not self.links:
            unknown = links.why_unknown(links.numa)
            if unknown:
                log.warning("GPU topology unknown (%s): allocations prefer GPUs by NUMA node instead", unknown)
            self.links = links
        self.cdi_names = self._cdi_names(inventory, generated, options)
        self.profiles = {g.uuid: [model.mig_profile(p) for p in g.mig.profiles] for g in inventory.gpus if g.mig}
        if inventory != previous:
            # A copy: a listener may remove itself (the deferred MIG reconcile, once the driver
            # is there).
            for listener in list(self.inventory_listeners):
                try:
                    listener(inventory)
                except Exception:       # a feature's failure never stops the inventory
                    log.exception("inventory listener %r failed", listener)
        if self._restore_pending and self.driver.ready:
            await self._restore_locked(list(self.allocations.values()), before)
            return
        self.publish(before)

    # ---- publishing ---------------------------------------------------------------

    # The allocations change through these (they drop the device index below).

    @property
    def allocations(self) -> dict[str, alloc_rules.Allocation]:
        return self._allocations

    @allocations.setter
    def allocations(self, value: dict) -> None:
        self._allocations = value
        self._users = None

    def add_allocation(self, alloc: alloc_rules.Allocation) -> None:
        self._allocations[alloc.id] = alloc
        self._users = None

    def remove_allocation(self, alloc_id: str) -> None:
        del self._allocations[alloc_id]
        self._users = None

    def users(self) -> dict[str, list[tuple[str, str]]]:
        """uuid -> [(allocation id, strategy)], built once per change of the allocations
        (the allocation and the publish that follows it both read it)."""
        if self._users is None:
            users: dict[str, list[tuple[str, str]]] = {}
            for a in self._allocations.values():
                for uuid in a.devices:
                    users.setdefault(uuid, []).append((a.id, a.strategy_of(uuid)))
            self._users = users
        return self._users

    def made_for(self) -> dict[str, str]:
        """MIG device uuid -> the allocation it was made for (being made for, meanwhile)."""
        out = dict(self.making)
        for a in self._allocations.values():
            out.update({m["uuid"]: a.id for m in a.made})
        return out

    def _node_view(self) -> dict:
        inv = self.inventory
        err = self.inventory_error
        node = model.node(inv, hostname=os.uname().nodename, simulated=self.host.simulated)
        node.update({
            "inventory": {"state": "error" if err else ("ok" if inv else "starting"),
                          "code": err.code if err else None, "message": err.message if err else None},
            "driver": self.driver.summary(),
            "checkpoint": self.checkpoint_view(),
            "cdi": {"kind": self.spec_options.kind if self.spec_options else None,
                    "spec": str(self._spec_path()) if self.spec_options else None,
                    "devices": len(self.spec.device_names) if self.spec else 0,
                    "problems": [p.message for p in self.spec.problems] if self.spec else [],
                    "allocation_kind": transient.ALLOCATION_KIND},
            "vfio": self.passthrough.view(),
            "agent": {"version": __version__, "pid": os.getpid(), "api": "v1",
                      "started": round(self.started, 3), "config": self.settings.source}})
        return node

    def set_checkpoint_damage(self, records: list) -> None:
        """The unreadable checkpoint records in force (none: the checkpoint is whole)."""
        self.checkpoint_damage = list(records)
        self.metrics.checkpoint_damage(len(records))

    async def dismiss_unreadable(self, uid: int) -> dict:
        """An admin's decision on the unreadable checkpoint records: they no longer hold devices
        (their files stay where they were kept). The records dismissed, as the view had them."""
        async with self.mutex:
            before = self.checkpoint_view()
            records = await self.blocking(checkpoint.dismiss, self.host)
            self.set_checkpoint_damage([])
            for r in records:
                log.warning("unreadable allocations checkpoint record dismissed by uid %d (%s; kept in %s)", uid,
                            r.reason, r.kept_as, extra={"fields": {"checkpoint": r.kept_as}})
            self.publish()
        return {"dismissed": before["unreadable"]}

    def checkpoint_view(self) -> dict:
        records = self.checkpoint_damage
        held = checkpoint.held_devices(records) if records else frozenset()
        return {"state": "damaged" if records else "ok",
                "unreadable": [{k: v for k, v in r.to_json().items() if k != "digest"} for r in records],
                "held_devices": None if held is None else sorted(held)}

    def _spec_path(self):
        """The node spec's path, found again only when the spec's options change (resolving
        it through the host root is the dearest part of a node view)."""
        options, path = self._spec_file
        if options is not self.spec_options:
            from ..cdi.refresh import spec_path
            path = spec_path(self.host, self.spec_options)
            self._spec_file = (self.spec_options, path)
        return path

    def publish(self, before=(), *, allocations_only: bool = False) -> None:
        """Publish ``before`` events, then the device and node changes since the last
        snapshot; build the next snapshot. Loop thread only. ``allocations_only``: only
        allocations changed, so the node's view and the devices' names are the last
        snapshot's (an allocation changes neither)."""
        for type_, payload in before:
            self.events.publish(type_, payload)
        views = device_views(self.inventory, self.cdi_names, self.health, self.users(), self.default_health,
                             self.sharing.devices(), self._base_views, self.made_for())
        old = self.snapshot.devices
        for type_, uuid, changed in diff_devices(old, views):
            if type_ == "device_removed":
                self.events.publish(type_, {"device": old[uuid]})
                continue
            view = views[uuid]
            moved = frozenset(old[uuid]["allocations"]).symmetric_difference(view["allocations"]) \
                if changed == ["allocations"] else None
            view["revision"] = self.events.publish(
                type_, lambda r, v=view, c=changed: {"device": {**v, "revision": r}, **({"changed": c} if c else {})},
                moved)
        for uuid, view in views.items():
            view.setdefault("revision", old.get(uuid, {}).get("revision", self.events.revision))
        node = self.snapshot.node if allocations_only else self._node_view()
        if node != self.snapshot.node:
            # As GET /v1/node shows it: with its revision (the event's).
            self.events.publish("node_changed", lambda r: {"node": {"revision": r, **node}})
        unreadable = [model.unreadable(u) for u in (self.inventory.unreadable if self.inventory else ())]
        unread = [model.unread(u) for u in (self.inventory.unread if self.inventory else ())]
        lookup = self.snapshot.lookup if allocations_only else lookup_table(views)
        self.snapshot = Snapshot(self.events.revision, node, views, unreadable,
                                 dict(self.allocations), lookup, self.profiles,
                                 labels=self.labels, unread=unread)
        for listener in self.publish_listeners:
            listener()

    def publish_soon(self, before=(), *, allocations_only: bool = False) -> None:
        """``publish`` at the loop's next turn, for a change whose request is being answered:
        the answer goes out first, without waiting for the views and events. It is queued
        while the change holds the mutex, so a later change's publish is queued after it and
        the events keep the order of the changes. Changes queued before that turn are
        published together: their events in order, then one diff of the views."""
        pending = self._pending_publish
        if pending is not None:
            pending[0].extend(before)
            pending[1] = pending[1] and allocations_only
            return
        self._pending_publish = pending = [list(before), allocations_only]

        def publish():
            self._pending_publish = None
            self.publish(pending[0], allocations_only=pending[1])
        asyncio.get_running_loop().call_soon(publish)

    def set_health(self, uuid: str, health: Health) -> None:
        """Record a device's health (the health monitor's entry point); publishes the change."""
        if self.health.get(uuid) != health:
            self.health[uuid] = health
            self.publish()

    # ---- start-up -----------------------------------------------------------------

    async def start(self) -> None:
        """Start-up reconcile: MIG (finish an interrupted apply, then the configured layout),
        the inventory and node spec, then the checkpointed allocations."""
        async with self.mutex:
            self.driver.clear_stale_marker()
            await self.driver.verify("start")
            saved = await self.blocking(checkpoint.load, self.host)
            self.set_checkpoint_damage(await self.blocking(checkpoint.unreadable, self.host))
            # A GPU a crash left half passed through goes forward or back before NVML is read.
            saved = await self.blocking(self.passthrough.settle, saved)
            # Loaded first so the MIG reconcile cannot take their devices away.
            self.allocations = {a.id: a for a in saved}
            self._restore_pending = True
            await self.mig.reconcile(self.settings.mig, "start")
            await self.refresh_locked("start")
            if self._restore_pending and saved:
                # The inventory is unreadable, or the driver does not verify: keep the
                # checkpoint untouched, the devices may come back with the driver; restored
                # at the first successful read with a verified driver.
                log.warning("driver or inventory unusable: %d allocation(s) kept unverified until "
                            "both are", len(saved))

    async def _restore_locked(self, saved: list, before=()) -> None:
        kept, dropped = await self.blocking(self.allocator.restore, saved)
        self._restore_pending = False
        for alloc_id, why in dropped:
            log.warning("allocation %s dropped: %s", alloc_id, why,
                        extra={"fields": {"allocation_id": alloc_id}})
        self.allocations = {a.id: a for a in kept}
        if kept:
            log.info("restored %d allocation(s)", len(kept))
        self.publish([*before, *(("allocation_deleted", {"allocation": {"id": alloc_id}, "reason": why})
                                 for alloc_id, why in dropped)])
        if self.allocator.undone_at_start:
            await self.refresh_locked("MIG devices of an interrupted allocation destroyed")
