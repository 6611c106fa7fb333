"""MIG by label, the executor: one pass reads the label, asks the agent for a plan, and
writes the state, the Event, and applies through the agent (``migplan`` decides).

Level-triggered: each pass looks at the label as it is now, so a label that flaps is
applied at its last value, with no queue. A value reconciled (success or failed) is not
tried again until the label or the file changes; a pass that finds the agent away, or an
apply the agent dropped (it stopped mid-apply: its journal settles the layout when it is
back), is tried again once the agent is back, and publishes what is then in place.
"""

from __future__ import annotations

import logging

from ...errors import ConflictError, HostagentError, UnavailableError
from . import migplan
from .clearing import Clearing
from .keys import MIG_STATE, PENDING

__all__ = ["MigByLabel"]

log = logging.getLogger("hostagent.plugins")

WHY = "mig.config"


class MigByLabel:
    def __init__(self, ctx, mig_file):
        self.ctx = ctx
        self.file = mig_file            # configs.MigFile, replaced when the file changes
        self.version = 0                # the file's reads: a new one reconciles again
        self.done = None                # (name, version) reconciled
        self.waiting: tuple | None = None   # the allocations a wait is for (the Event said so)
        self.clearing = Clearing(ctx, WHY)

    def reload(self, mig_file) -> None:
        self.file, self.version = mig_file, self.version + 1

    @property
    def due(self) -> bool:
        """A pass is due without a change: an eviction's time is up."""
        return self.clearing.overdue()

    def _finish(self, key, step) -> None:
        if step.event:                  # first: once the state says it, the Event says why
            self.ctx.recorder.record(*step.event)
        if self.clearing.active:        # the cordon lifted before the state says it is done
            self.clearing.finish()
        if step.state:
            self.ctx.state(MIG_STATE, step.state)
        self.done, self.waiting = key, None

    def reconcile(self, labels: dict) -> None:
        name = migplan.wanted(labels)
        if name is None:
            self.done = self.waiting = None
            if self.clearing.active:
                self.clearing.finish()
            return
        key = (name, self.version)
        if key == self.done or not self.ctx.link.view.connected:
            return
        if self.done is not None and self.done[0] != name:
            self.waiting = None
        step = migplan.check_name(name, self.file)
        if step is not None:
            return self._finish(key, step)
        spec = self.file.document()
        try:
            answer = self.ctx.client().mig_plan(name, spec=spec)
        except UnavailableError as e:
            log.info("MIG config %r waits for the agent: %s", name, e.message)
            return
        except HostagentError as e:
            return self._finish(key, migplan.refused(name, e.message))
        step = migplan.after_plan(name, answer, self.ctx.options.on_busy)
        if not step.apply and not step.busy:
            return self._finish(key, step)
        self.ctx.state(MIG_STATE, PENDING)
        if step.busy:
            return self._busy(key, name, step)
        self._apply(key, name, spec)

    def _busy(self, key, name: str, step) -> None:
        ids = tuple(a["id"] for a in step.busy)
        if step.evict:
            if self.clearing.overdue():
                return self._finish(key, migplan.refused(
                    name, f"the devices in use were not released within {self.ctx.options.eviction_timeout:g} s "
                          f"of the eviction: {migplan.busy_text(step.busy)}"))
            if self.clearing.due(ids):
                if not self.clearing.active:         # said once, not again after a restart
                    self.ctx.recorder.record(*step.event)
                problem = self.clearing.start(ids, step.busy, f"MIG config {name!r}")
                if problem:
                    return self._finish(key, migplan.refused(name, problem))
            return
        if self.waiting != ids:
            self.ctx.recorder.record(*step.event)
            self.waiting = ids

    def _apply(self, key, name: str, spec) -> None:
        try:
            with self.ctx.long_client() as c:
                answer = c.mig_apply(name, spec=spec)
        except ConflictError as e:
            if e.code == "device_busy":      # allocated since the plan: the next pass plans again
                log.info("MIG config %r: %s", name, e.message)
                return
            return self._finish(key, migplan.refused(name, e.message))
        except UnavailableError as e:
            log.warning("MIG config %r: the agent went away during the apply (%s); its journal settles the "
                        "layout, which is published when it is back", name, e.message)
            return
        except HostagentError as e:
            return self._finish(key, migplan.refused(name, e.message))
        self._finish(key, migplan.applied(name, answer))
