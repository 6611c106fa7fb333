"""The agent: the node's state in one place, changed by one writer, published as events.

Imperative shell around the pure modules: blocking work (NVML, spec and checkpoint writes,
the node lock) runs on one worker thread; state is replaced and events published on the
event loop's thread only, so readers never see a half-made change and need no locks.
Mutations are serialised by an asyncio lock and take the node lock around their writes, so
the CLI acting directly never interleaves with the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .. import __version__
from ..cdi import transient
from ..errors import HostagentError, NotFoundError
from ..hostroot import HostRoot
from ..lock import node_lock
from . import allocations as alloc_rules
from . import checkpoint, faults
from .events import EventLog, RevisionClock
from .health import Health, unmonitored
from .settings import Settings
from .state import Snapshot, diff_devices, lookup_table
from .views import allocation_view, device_views, profile_view

__all__ = ["Agent"]

log = logging.getLogger("hostagent.daemon")


class Agent:
    def __init__(self, host: HostRoot, settings: Settings):
        self.host = host
        self.settings = settings
        self.started = time.time()
        self.events = EventLog(RevisionClock(host.state_dir / "revision"), settings.api.watch_buffer)
        self.default_health = unmonitored(self.started)
        self.health: dict[str, Health] = {}
        self.inventory = None
        self.inventory_error: HostagentError | None = None
        self.spec = None                  # the node spec's GeneratedSpec
        self.spec_options = None
        self.cdi_names: dict[str, tuple[str, ...]] = {}
        self.allocations: dict[str, alloc_rules.Allocation] = {}
        self.snapshot = Snapshot(self.events.revision, {}, {}, [], {}, {})
        self._restore_pending = False     # checkpoint loaded, not yet checked against the inventory
        from .mig import MigOps
        self.mig = MigOps(self)
        self.mutex = asyncio.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="hostagent-worker")

    # ---- plumbing ---------------------------------------------------------------

    async def blocking(self, fn, *args):
        """Run ``fn`` on the worker thread (NVML and file writes never block the loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    def _interpreter(self) -> str:
        hook = self.settings.sections.get("hook") or {}
        return hook.get("interpreter") or sys.executable

    # ---- inventory and the node spec ------------------------------------------------

    def _read(self):
        """Worker: read the inventory and refresh the node spec (written only if changed)."""
        from ..cdi import refresh
        from ..cdi.spec import SpecOptions
        from ..devices import read_inventory
        options = SpecOptions(hook_interpreter=self._interpreter())
        inventory = read_inventory(self.host)
        # Always regenerated (a few ms): the file is rewritten only when its content differs,
        # which also restores a spec someone deleted.
        change, generated = refresh.refresh(self.host, options, inventory=inventory)
        return inventory, generated, options, change

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
        """Re-read the inventory; publish what changed. Returns the revision."""
        async with self.mutex:
            await self._refresh_locked(reason)
        return self.events.revision

    async def _refresh_locked(self, reason: str) -> None:
        try:
            inventory, generated, options, change = await self.blocking(self._read)
        except HostagentError as e:
            if self.inventory_error is None or self.inventory_error.message != e.message:
                log.error("cannot read the inventory (%s): %s", reason, e.message,
                          extra={"fields": {"error_code": e.code}})
            self.inventory_error = e
            self._publish()
            return
        if self.inventory_error is not None:
            log.info("inventory readable again")
        self.inventory_error = None
        if change is not None and change.written:
            log.info("CDI spec %s", change.describe(), extra={"fields": {"reason": reason}})
        for problem in generated.problems:
            log.warning("CDI: %s", problem.message)
        self.inventory, self.spec, self.spec_options = inventory, generated, options
        self.cdi_names = self._cdi_names(inventory, generated, options)
        if self._restore_pending:
            await self._restore_locked(list(self.allocations.values()))
            return
        self._publish()

    # ---- publishing ---------------------------------------------------------------

    def _users(self) -> dict[str, list[tuple[str, str]]]:
        users: dict[str, list[tuple[str, str]]] = {}
        for a in self.allocations.values():
            for uuid in a.devices:
                users.setdefault(uuid, []).append((a.id, a.strategy))
        return users

    def _node_view(self) -> dict:
        inv = self.inventory
        err = self.inventory_error
        node = {"hostname": os.uname().nodename,
                "driver_version": inv.driver_version if inv else None,
                "cuda_driver_version": inv.cuda_driver_version if inv else None,
                "nvml_version": inv.nvml_version if inv else None,
                "simulated": self.host.simulated,
                "device_nodes": inv.device_nodes if inv else None,
                "gpus": len(inv.gpus) if inv else 0,
                "mig_devices": len(inv.mig_devices) if inv else 0,
                "unreadable_gpus": len(inv.unreadable) if inv else 0,
                "inventory": {"state": "error" if err else ("ok" if inv else "starting"),
                              "code": err.code if err else None,
                              "message": err.message if err else None},
                "cdi": {"kind": self.spec_options.kind if self.spec_options else None,
                        "spec": str(self._spec_path()) if self.spec_options else None,
                        "devices": len(self.spec.device_names) if self.spec else 0,
                        "problems": [p.message for p in self.spec.problems] if self.spec else [],
                        "allocation_kind": transient.ALLOCATION_KIND},
                "agent": {"version": __version__, "pid": os.getpid(), "api": "v1",
                          "started": round(self.started, 3), "config": self.settings.source}}
        return node

    def _spec_path(self):
        from ..cdi.refresh import spec_path
        return spec_path(self.host, self.spec_options)

    def _publish(self, before=()) -> None:
        """Publish ``before`` events, then the device and node changes since the last
        snapshot; build the next snapshot. Loop thread only."""
        for type_, payload in before:
            self.events.publish(type_, payload)
        users = {u: [a for a, _ in lst] for u, lst in self._users().items()}
        views = device_views(self.inventory, self.cdi_names, self.health, users, self.default_health)
        old = self.snapshot.devices
        for type_, uuid, changed in diff_devices(old, views):
            if type_ == "device_removed":
                self.events.publish(type_, {"device": old[uuid]})
                continue
            view = views[uuid]
            view["revision"] = self.events.publish(
                type_, lambda r, v=view, c=changed: {"device": {**v, "revision": r}, **({"changed": c} if c else {})})
        for uuid, view in views.items():
            view.setdefault("revision", old.get(uuid, {}).get("revision", self.events.revision))
        node = self._node_view()
        if node != self.snapshot.node:
            self.events.publish("node_changed", {"node": node})
        unreadable = [{"index": u.index, "error": u.error, "nvml_code": u.nvml_code}
                      for u in (self.inventory.unreadable if self.inventory else ())]
        profiles = {g.uuid: [profile_view(p) for p in g.mig.profiles]
                    for g in (self.inventory.gpus if self.inventory else ()) if g.mig}
        self.snapshot = Snapshot(self.events.revision, node, views, unreadable,
                                 dict(self.allocations), lookup_table(views), profiles)

    def set_health(self, uuid: str, health: Health) -> None:
        """Record a device's health (the health monitor's entry point); publishes the change."""
        if self.health.get(uuid) != health:
            self.health[uuid] = health
            self._publish()

    # ---- allocations --------------------------------------------------------------

    def _candidates(self) -> list[alloc_rules.Candidate]:
        out = []
        inv = self.inventory
        if inv is None:
            return out
        for gpu in inv.gpus:
            why = "MIG is enabled: allocate its MIG devices" if gpu.mig_enabled else None
            out.append(alloc_rules.Candidate(
                gpu.uuid, str(gpu.index), "gpu", gpu.name, gpu.memory_mib, gpu.compute_capability,
                None, (gpu.index, -1), why or (None if self.cdi_names.get(gpu.uuid) else "not in the CDI spec")))
            for d in (gpu.mig.devices if gpu.mig else ()):
                out.append(alloc_rules.Candidate(
                    d.uuid, d.name, "mig", gpu.name, d.memory_mib, gpu.compute_capability, d.profile,
                    (gpu.index, d.index), None if self.cdi_names.get(d.uuid) else "not in the CDI spec"))
        return out

    def _records(self, uuids) -> list:
        by_uuid = {}
        for gpu in self.inventory.gpus:
            by_uuid[gpu.uuid] = gpu
            for d in (gpu.mig.devices if gpu.mig else ()):
                by_uuid[d.uuid] = d
        return [by_uuid[u] for u in uuids]

    def _write_spec(self, alloc: alloc_rules.Allocation, records) -> alloc_rules.Allocation:
        """Worker: render and write the allocation's transient spec; returns the allocation
        with the derived fields filled in."""
        import dataclasses
        from ..cdi.discover import Discovery
        from ..cdi.render import render
        from ..fileio import ensure_dir, write_atomic
        discovery = Discovery(self.host, self.inventory.driver_version)
        spec, merged = transient.build_transient_spec(discovery, alloc.id, records, self._interpreter())
        path = transient.spec_file(self.host, alloc.id)
        ensure_dir(path.parent, 0o755)
        text = render(spec)
        try:
            unchanged = path.read_text() == text
        except OSError:
            unchanged = False
        if not unchanged:
            write_atomic(path, text, mode=0o644)
        return dataclasses.replace(alloc, cdi_devices=tuple(f"{spec['kind']}={d['name']}" for d in spec["devices"]),
                                   container_edits=merged, spec_path=str(path))

    def _commit_new(self, alloc, records, others) -> alloc_rules.Allocation:
        """Worker: spec first, then the checkpoint (the commit point)."""
        with node_lock(self.host, f"allocate {alloc.id}"):
            alloc = self._write_spec(alloc, records)
            faults.point("allocate:after_spec")
            checkpoint.save(self.host, [*others, alloc])
            faults.point("allocate:after_checkpoint")
        return alloc

    async def allocate(self, body: dict) -> tuple[bool, alloc_rules.Allocation]:
        """Create (True) or return the identical existing (False) allocation."""
        request = alloc_rules.normalize(body)
        async with self.mutex:
            existing = self.allocations.get(request["id"])
            if existing is not None:
                if existing.request == request:
                    return False, existing
                raise alloc_rules.AllocationConflict(
                    f"allocation {request['id']!r} exists with a different request",
                    hint="release it first, or use another id", id=request["id"])
            clash = next((a for a in self.allocations
                          if transient.safe_id(a) == transient.safe_id(request["id"])), None)
            if clash is not None:
                raise alloc_rules.AllocationConflict(
                    f"allocation id {request['id']!r} names the same spec file as {clash!r}",
                    id=request["id"], clashes_with=clash)
            if self.inventory is None:
                raise self._unavailable()
            uuids = alloc_rules.select(
                request, self._candidates(), self._users(),
                resolve=lambda name: self.snapshot.lookup.get(name),
                healthy=lambda u: (self.health.get(u) or self.default_health).allocatable)
            alloc = alloc_rules.Allocation(id=request["id"], devices=tuple(uuids), request=request,
                                           created=time.time())
            alloc = await self.blocking(self._commit_new, alloc, self._records(uuids),
                                        list(self.allocations.values()))
            self.allocations[alloc.id] = alloc
            log.info("allocation %s created: %s", alloc.id, ", ".join(alloc.cdi_devices),
                     extra={"fields": {"allocation_id": alloc.id}})
            self._publish([("allocation_created", {"allocation": allocation_view(alloc)})])
            return True, alloc

    def _commit_release(self, alloc, others) -> None:
        """Worker: checkpoint first (the commit point), then remove the spec."""
        with node_lock(self.host, f"release {alloc.id}"):
            checkpoint.save(self.host, others)
            faults.point("release:after_checkpoint")
            try:
                os.unlink(transient.spec_file(self.host, alloc.id))
            except FileNotFoundError:
                pass

    async def release(self, alloc_id: str) -> alloc_rules.Allocation:
        async with self.mutex:
            alloc = self.allocations.get(alloc_id)
            if alloc is None:
                raise NotFoundError(f"no allocation {alloc_id!r}", id=alloc_id)
            others = [a for a in self.allocations.values() if a.id != alloc_id]
            await self.blocking(self._commit_release, alloc, others)
            del self.allocations[alloc_id]
            log.info("allocation %s released", alloc_id, extra={"fields": {"allocation_id": alloc_id}})
            self._publish([("allocation_deleted", {"allocation": allocation_view(alloc), "reason": "released"})])
            return alloc

    def _unavailable(self):
        from ..errors import UnavailableError
        e = self.inventory_error
        return UnavailableError("the node's inventory is not available" + (f": {e.message}" if e else ""),
                                hint="see GET /v1/node and the agent's log")

    # ---- start-up -----------------------------------------------------------------

    def _restore(self, saved: list) -> tuple[list, list[tuple[str, str]]]:
        """Worker: rewrite the specs of checkpointed allocations whose devices are all still
        there and allocatable; drop the others; remove specs no allocation owns."""
        kept, dropped = [], []
        present = {uuid for uuid, names in self.cdi_names.items() if names}
        with node_lock(self.host, "restore allocations"):
            for alloc in saved:
                gone = [u for u in alloc.devices if u not in present]
                if gone:
                    dropped.append((alloc.id, f"device(s) {', '.join(gone)} gone or no longer allocatable"))
                    continue
                try:
                    kept.append(self._write_spec(alloc, self._records(alloc.devices)))
                except HostagentError as e:
                    dropped.append((alloc.id, e.message))
            owned = {transient.safe_id(a.id) for a in kept}
            for sid, path in transient.transient_spec_files(self.host).items():
                if sid not in owned:
                    os.unlink(path)
                    log.warning("removed transient spec %s: no allocation owns it", path,
                                extra={"fields": {"spec": str(path)}})
            if len(kept) != len(saved):
                checkpoint.save(self.host, kept)
        return kept, dropped

    async def start(self) -> None:
        """Start-up reconcile: MIG (finish an interrupted apply, then the configured layout),
        the inventory and node spec, then the checkpointed allocations."""
        async with self.mutex:
            saved = await self.blocking(checkpoint.load, self.host)
            # Loaded first so the MIG reconcile cannot take their devices away.
            self.allocations = {a.id: a for a in saved}
            self._restore_pending = True
            await self.mig.reconcile(self.settings.mig, "start")
            await self._refresh_locked("start")
            if self._restore_pending and saved:
                # The inventory is unreadable: keep the checkpoint untouched, the devices may
                # come back with the driver; restored at the first successful read.
                log.warning("inventory unreadable: %d allocation(s) kept unverified until it is",
                            len(saved))

    async def _restore_locked(self, saved: list) -> None:
        kept, dropped = await self.blocking(self._restore, saved)
        self._restore_pending = False
        for alloc_id, why in dropped:
            log.warning("allocation %s dropped: %s", alloc_id, why,
                        extra={"fields": {"allocation_id": alloc_id}})
        self.allocations = {a.id: a for a in kept}
        if kept:
            log.info("restored %d allocation(s)", len(kept))
        self._publish([("allocation_deleted", {"allocation": {"id": alloc_id}, "reason": why})
                       for alloc_id, why in dropped])
