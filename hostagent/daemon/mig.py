"""The daemon's MIG operations: layouts (plan, apply), on-demand instances (create,
destroy), and the start-up reconcile (finish or roll back an interrupted apply, then the
configured layout). Everything changes the node through the MIG package's service and
executor, under the node lock, on the agent's worker thread; afterwards the agent
re-reads the inventory, which refreshes the node's CDI spec and publishes the changes.

Devices in an allocation are never taken away: a layout change or a destroy that would
remove one is refused (409 device_busy) before anything is touched. Nor are the devices an
unreadable record of the allocations checkpoint may hold, until an admin dismisses it.
"""

from __future__ import annotations

import asyncio
import logging

from ..errors import DriverNotLoaded, HostagentError, NvmlLibraryMissing
from ..lock import node_lock
from ..mig.planner import PLAN_SECONDS
from ..mig.solver import Budget
from .migops import (busy_allocations, created_instance, place_instance, refuse_allocated, remove_instance,
                     unreadable_holders)

__all__ = ["MigOps"]

log = logging.getLogger("hostagent.daemon")

# A layout's apply (or the start-up reconcile) on the worker: GPU resets of up to
# mig.reset.RESET_TIMEOUT each, hooks, rollback; past this the agent counts as stuck.
MIG_BUDGET = 3600.0


def _spec(body: dict):
    from ..mig.spec import parse_spec
    return parse_spec(body["spec"], "request body 'spec'") if body.get("spec") is not None else None


def _hooks(body: dict):
    """Hooks given in the request; run by the daemon, inside its sandbox (the CLI runs a
    hooks file itself instead)."""
    if not body.get("hooks"):
        return None
    import json
    from ..mig.hooks import parse_hooks
    return parse_hooks(json.dumps(body["hooks"]), "request body 'hooks'")


def _waits(settings, reason: str, why: str, until: str) -> None:
    """Log that the reconcile waits for the driver: the configured layout's, or, with none
    configured, only the check for an apply a crash interrupted."""
    if settings.config is None:
        log.warning("no MIG layout is configured (mig.config); the check for an interrupted MIG apply waits "
                    "(%s): %s; it runs when %s", reason, why, until)
    else:
        log.warning("MIG layout %r not applied yet (%s): %s; it is applied when %s", settings.config, reason,
                    why, until)


class MigOps:
    def __init__(self, agent):
        self.agent = agent
        self.host = agent.host
        self._deferred = None          # settings of a reconcile waiting for the driver
        self._later = None             # its task, once the driver is there

    # ---- helpers ------------------------------------------------------------------

    def _refuse_busy(self, inventory, plan) -> None:
        """Worker thread, while the loop holds the agent's mutex: the allocations stay put, and
        so do the devices unreadable checkpoint records may hold, until an admin dismisses them."""
        refuse_allocated(inventory, plan, list(self.agent.allocations.values()),
                         unreadable=unreadable_holders(inventory, self.agent.checkpoint_damage))

    def _checked(self, dry_run: bool = False, note=None):
        """``refuse`` for the MIG service: allocated devices stay put; then, right before the
        change, the MPS daemons of the devices it takes away stop (a dry run names them)."""
        from ..sharing.service import mig_guard
        return mig_guard(self.host, self._refuse_busy, dry_run, note or (lambda gpu, message: None))

    async def _after(self, reason: str) -> None:
        """The layout changed (or may have): publish it, then restart the MPS daemons of the
        devices the sharing configuration still names."""
        await self.agent.refresh_locked(reason)
        self.agent.sharing.paused = False
        await self.agent.sharing.reconcile_locked(reason)

    def _refresh_spec(self, host, progress=None) -> None:
        """Worker thread, under the node lock, right after the layout changed (applied, rolled
        back, recovered): the node's CDI spec describes the new MIG devices before anything
        else runs (an apply-exit hook restarting the device plugin). ``_after`` publishes the
        new inventory afterwards; the spec is then already up to date."""
        try:
            _, change, _ = self.agent.refresh_cdi()
        except HostagentError as e:
            log.error("the CDI spec was not refreshed after a MIG layout change: %s", e.message)
            if progress is not None:
                progress(None, f"warning: the CDI spec was not refreshed: {e.message}")
            return
        if progress is not None:
            progress(None, f"CDI spec: {change.describe() if change else 'not written: ' + self.agent.driver.why}")

    # ---- reads --------------------------------------------------------------------

    def layouts(self, snapshot_inventory) -> dict:
        from ..mig.journal import Journal
        from ..mig.layout import Layout
        from ..model import mig_layout
        gpus = [mig_layout(gpu, None if gpu.mig is None else Layout.of(gpu))
                for gpu in (snapshot_inventory.gpus if snapshot_inventory else ())]
        return {"gpus": gpus, "apply_in_progress": Journal.path(self.host).exists()}

    # ---- layouts ------------------------------------------------------------------

    def _plan_work(self, body: dict):
        from ..mig import service
        return service.plan_with_inventory(self.host, _spec(body), body.get("config"),
                                           mode_only=body.get("mode_only", False),
                                           on_layout_changed=self._refresh_spec,
                                           stop_requested=self.agent.stop_requested.is_set)

    async def plan(self, body: dict) -> dict:
        plan, notes, inventory = await self.agent.blocking(self._plan_work, body)
        if notes:                   # an interrupted apply was recovered: publish the layout
            async with self.agent.mutex:
                await self._after("mig recovery")
        return {"plan": plan.to_dict(), "notes": notes,
                "busy": busy_allocations(inventory, plan, self.agent.allocations.values(),
                                         unreadable_holders(inventory, self.agent.checkpoint_damage))}

    def _apply_work(self, body: dict, started: list, progress: list):
        from ..mig import service
        from ..mig.hooks import flag_env
        spec, hooks = _spec(body), _hooks(body)
        env = flag_env(skip_reset=body.get("skip_reset", False), mode_only=body.get("mode_only", False))

        def note(gpu, message):            # what the CLI prints on stderr when it acts itself
            progress.append({"gpu": gpu, "message": message})
        checked = self._checked(body.get("dry_run", False), note)

        def refuse(inventory, plan):
            checked(inventory, plan)
            started.append(True)            # past the refusals: counted as an apply
        return service.apply(self.host, spec, body.get("config"), mode_only=body.get("mode_only", False),
                             skip_reset=body.get("skip_reset", False), force=body.get("force", False),
                             dry_run=body.get("dry_run", False), hooks=hooks, hook_env=env, refuse=refuse,
                             progress=note, on_layout_changed=lambda host: self._refresh_spec(host, note),
                             lock_timeout=60.0, stop_requested=self.agent.stop_requested.is_set)

    async def apply(self, body: dict) -> dict:
        if not body.get("dry_run"):
            self.agent.driver.require("apply a MIG layout")
        async with self.agent.mutex:
            started, progress, ok = [], [], False
            self.agent.sharing.paused = True
            try:
                result = await self.agent.blocking(self._apply_work, body, started, progress, budget=MIG_BUDGET)
                ok = True
            finally:
                if not body.get("dry_run"):
                    if started:
                        self.agent.metrics.mig_apply(ok)
                    await self._after("mig apply")
        if result.report is not None:
            log.info("MIG config %r applied: %d GPU(s) changed", result.plan.config, len(result.plan.changed))
        return {**result.to_dict(), "dry_run": bool(body.get("dry_run")), "progress": progress,
                "revision": self.agent.events.revision}

    # ---- instances ----------------------------------------------------------------

    def _create_work(self, profile: str, gpu: str | None):
        from ..devices import read_inventory
        from ..mig.executor import execute
        from ..mig.recovery import recover
        with node_lock(self.host, f"mig create {profile}"):
            recover(self.host, on_layout_changed=self._refresh_spec)
            inventory = read_inventory(self.host)
            placed = place_instance(inventory, profile, gpu,
                                    Budget(PLAN_SECONDS, self.agent.stop_requested.is_set))
            execute(self.host, inventory, placed.plan, on_layout_changed=self._refresh_spec)
            dev = created_instance(read_inventory(self.host), placed.gpu.index, placed.gi)
            return placed, dev

    async def create(self, body: dict) -> dict:
        self.agent.driver.require("create a MIG instance")
        async with self.agent.mutex:
            try:
                placed, dev = await self.agent.blocking(self._create_work, body["profile"], body.get("gpu"))
            finally:
                await self._after("mig create")
        if dev is None:
            raise HostagentError("the new MIG instance was created but is not in the inventory")
        log.info("MIG device %s (%s) created on GPU %d at %s", dev.uuid, dev.profile, placed.gpu.index,
                 placed.gi.placement, extra={"fields": {"mig_uuid": dev.uuid}})
        return self.agent.snapshot.devices.get(dev.uuid) or {"uuid": dev.uuid}

    def _destroy_work(self, uuid: str, force: bool):
        from ..devices import read_inventory
        from ..mig.executor import execute
        from ..mig.recovery import recover
        with node_lock(self.host, f"mig destroy {uuid}"):
            recover(self.host, on_layout_changed=self._refresh_spec)
            inventory = read_inventory(self.host)
            dev, plan = remove_instance(inventory, uuid)
            self._checked()(inventory, plan)
            execute(self.host, inventory, plan, force=force, on_layout_changed=self._refresh_spec)
            return dev

    async def destroy(self, uuid: str, force: bool = False) -> dict:
        self.agent.driver.require("destroy a MIG instance")
        async with self.agent.mutex:
            before = self.agent.snapshot.devices.get(uuid)
            self.agent.sharing.paused = True
            try:
                dev = await self.agent.blocking(self._destroy_work, uuid, force)
            finally:
                await self._after("mig destroy")
        log.info("MIG device %s (%s) destroyed", dev.uuid, dev.profile, extra={"fields": {"mig_uuid": dev.uuid}})
        return before or {"uuid": dev.uuid}

    # ---- start-up and reload ------------------------------------------------------

    def _reconcile_work(self, settings):
        """Finish or roll back an interrupted apply; then the configured layout."""
        from ..mig import service
        from ..mig.spec import load_spec
        notes = []
        note = service.recover_pending(self.host, wait=60.0, on_layout_changed=self._refresh_spec)
        if note:
            notes.append(note)
        if settings.config is None:
            return notes, None
        spec = load_spec(settings.config_file) if settings.config_file else None
        result = service.apply(self.host, spec, settings.config, refuse=self._checked(),
                               on_layout_changed=self._refresh_spec, lock_timeout=60.0,
                               stop_requested=self.agent.stop_requested.is_set)
        return notes + result.notes, result

    async def reconcile(self, settings, reason: str) -> None:
        """Never fatal: a layout that cannot be applied is logged; the daemon serves on.
        Without a verified driver, it is done when the driver is loaded and verifies. The MPS
        daemons it stopped start again with the sharing reconcile that follows (the agent's
        start, a reload)."""
        if not self.agent.driver.ready:
            _waits(settings, reason, self.agent.driver.why, "the driver is loaded and verifies")
            self._when_driver_ready(settings)
            return
        self.agent.sharing.paused = True
        try:
            await self._reconcile(settings, reason)
        finally:
            self.agent.sharing.paused = False

    async def _reconcile(self, settings, reason: str) -> None:
        try:
            notes, result = await self.agent.blocking(self._reconcile_work, settings, budget=MIG_BUDGET)
        except (DriverNotLoaded, NvmlLibraryMissing) as e:
            _waits(settings, reason, e.message, "the driver is loaded")
            self._when_driver_loads(settings)
            return
        except HostagentError as e:
            log.error("MIG layout %r not applied (%s): %s", settings.config, reason, e.message)
            if settings.config is not None:
                self.agent.metrics.mig_apply(False)
            return
        if result is not None:
            self.agent.metrics.mig_apply(True)
        for note in notes:
            log.warning("MIG: %s", note)
        if result is not None:
            changed = result.plan.changed
            log.info("MIG config %r %s (%s)", result.plan.config,
                     f"applied to {len(changed)} GPU(s)" if changed else "already in place", reason)

    def _when_driver_loads(self, settings) -> None:
        """Reconcile at the first inventory read that succeeds: nodes whose driver is loaded
        from a container (the GPU operator's) get their layout once it is there. Loop thread."""
        waiting = self._deferred is not None
        self._deferred = settings                 # a reload meanwhile: its settings win
        if waiting:
            return

        def driver_loaded(inventory) -> None:
            self.agent.inventory_listeners.remove(driver_loaded)
            later, self._deferred = self._deferred, None
            self._later = asyncio.get_running_loop().create_task(self._reconcile_later(later))
        self.agent.inventory_listeners.append(driver_loaded)

    def _when_driver_ready(self, settings) -> None:
        """Reconcile once the driver gate opens. Loop thread."""
        waiting = self._deferred is not None
        self._deferred = settings
        if waiting:
            return

        def driver_ready(ready: bool) -> None:
            if not ready:
                return
            self.agent.driver.remove_listener(driver_ready)
            later, self._deferred = self._deferred, None
            self._later = asyncio.get_running_loop().create_task(self._reconcile_later(later))
        self.agent.driver.add_listener(driver_ready)

    async def _reconcile_later(self, settings) -> None:
        async with self.agent.mutex:
            await self.reconcile(settings, "driver loaded")
            await self._after("mig layout")
