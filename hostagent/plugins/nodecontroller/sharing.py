"""Sharing by label, the executor: the chosen named config of ``--sharing-configs`` applied
through the agent (journaled, all or nothing), ``nvidia.com/device-plugin.config.state``
written around it. A change the agent refuses because it would take replicas from
allocations follows ``--on-busy``, as a MIG change does. Level-triggered like ``mig``."""

from __future__ import annotations

import logging

from ...errors import ConflictError, HostagentError, UnavailableError
from . import sharingplan
from .configs import config_names, read_sharing_config
from .clearing import Clearing
from .keys import FAILED, PENDING, SHARING_STATE

__all__ = ["SharingByLabel"]

log = logging.getLogger("hostagent.plugins")

WHY = "device-plugin.config"


class SharingByLabel:
    def __init__(self, ctx):
        self.ctx = ctx
        self.folder = ctx.options.sharing_configs
        self.version = 0
        self.done = None
        self.waiting: tuple | None = None
        self.clearing = Clearing(ctx, WHY)

    def reload(self) -> None:
        self.version += 1

    @property
    def due(self) -> bool:
        return self.clearing.overdue()

    def _finish(self, key, state: str | None, event) -> None:
        if event:                       # first: once the state says it, the Event says why
            self.ctx.recorder.record(*event)
        if self.clearing.active:        # the cordon lifted before the state says it is done
            self.clearing.finish()
        if state:
            self.ctx.state(SHARING_STATE, state)
        self.done, self.waiting = key, None

    def reconcile(self, labels: dict) -> None:
        if self.folder is None:
            return
        try:
            names = config_names(self.folder)
        except OSError as e:
            names, problem = {}, f"{self.folder}: cannot list the sharing configs: {e.strerror}"
        else:
            problem = None
        choice = sharingplan.choose(labels, self.ctx.options.default_sharing_config, names, self.folder)
        key = (choice.name, choice.problem, self.version)
        if key == self.done or not self.ctx.link.view.connected:
            return
        if problem or choice.problem:
            return self._finish(key, *sharingplan.failed(None, problem or choice.problem))
        document = None
        if choice.name is not None:
            config, problem = read_sharing_config(names[choice.name])
            if problem:
                return self._finish(key, *sharingplan.failed(choice.name, problem))
            document = None if config.empty else config.document
        try:
            current = (self.ctx.client().sharing().get("config") or {}).get("document")
        except UnavailableError as e:
            log.info("sharing config %r waits for the agent: %s", choice.name, e.message)
            return
        except HostagentError as e:
            return self._finish(key, *sharingplan.failed(choice.name, e.message))
        if sharingplan.in_place(current, document):
            return self._finish(key, sharingplan.applied(choice.name, choice.why)[0], None)
        self.ctx.state(SHARING_STATE, PENDING)
        self._apply(key, choice, document)

    def _apply(self, key, choice, document) -> None:
        try:
            with self.ctx.long_client() as c:
                out = c.sharing_apply(document)
        except ConflictError as e:
            if e.code == "device_busy":
                return self._busy(key, choice, e)
            return self._finish(key, *sharingplan.failed(choice.name, e.message))
        except UnavailableError as e:
            log.warning("sharing config %r: the agent went away during the apply (%s)", choice.name, e.message)
            return
        except HostagentError as e:
            return self._finish(key, *sharingplan.failed(choice.name, e.message))
        if out.get("rolled_back") or (out.get("report") or {}).get("failed"):
            errors = [r.get("error") for r in (out.get("report") or {}).get("results") or () if r.get("error")]
            return self._finish(key, *sharingplan.failed(choice.name, "the agent rolled it back: "
                                                          + ("; ".join(errors) or "a step failed")))
        self._finish(key, *sharingplan.applied(choice.name, choice.why))

    def _busy(self, key, choice, error) -> None:
        details = getattr(error, "details", None) or {}
        devices, ids = tuple(details.get("devices") or ()), tuple(details.get("allocations") or ())
        on_busy = self.ctx.options.on_busy
        if on_busy == "fail":
            return self._finish(key, FAILED, sharingplan.failed(
                choice.name, f"it would change {sharingplan.busy_text(devices, ids)}")[1])
        if on_busy == "wait":
            if self.waiting != ids:
                self.ctx.recorder.record(*sharingplan.waiting(choice.name, devices, ids))
                self.waiting = ids
            return
        if self.clearing.overdue():
            return self._finish(key, *sharingplan.failed(
                choice.name, f"the devices in use were not released within {self.ctx.options.eviction_timeout:g} s "
                             f"of the eviction: {sharingplan.busy_text(devices, ids)}"))
        if not self.clearing.due(ids):
            return
        busy = []
        for alloc_id in ids:
            try:
                alloc = self.ctx.client().allocation(alloc_id)
            except HostagentError:
                continue                     # released meanwhile
            busy.append({"id": alloc_id, "labels": alloc.get("labels") or {},
                         "devices": sorted(set(alloc.get("devices") or ()) & set(devices))})
        problem = self.clearing.start(ids, busy, f"sharing config {choice.name!r}")
        if problem:
            self._finish(key, *sharingplan.failed(choice.name, problem))
