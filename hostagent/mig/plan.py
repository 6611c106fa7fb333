"""The MIG plan: per GPU, the exact layout before and after and the steps between them.

``diff`` turns two exact layouts into steps, and is used both for applying a config and for
restoring a checkpoint: GPU instances with the same profile and placement are kept, and
inside a kept one, compute instances with the same profile and placement are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..devices.records import Gpu, Inventory
from .layout import CiLayout, GiLayout, Layout
from .profiles import ci_name

__all__ = ["Step", "GpuPlan", "MigPlan", "diff", "affected_devices", "DESTROY_CI", "DESTROY_GI", "SET_MODE",
           "CREATE_GI", "CREATE_CI"]

DESTROY_CI, DESTROY_GI, SET_MODE = "destroy-ci", "destroy-gi", "set-mode"
CREATE_GI, CREATE_CI = "create-gi", "create-ci"


@dataclass(frozen=True)
class Step:
    action: str
    gpu: int
    gi: GiLayout | None = None       # the GPU instance acted on, or holding the CI
    ci: CiLayout | None = None
    enabled: bool | None = None      # SET_MODE
    gi_id: int | None = None         # existing instance ids, for destroys
    ci_id: int | None = None

    def describe(self) -> str:
        if self.action == SET_MODE:
            return f"{'enable' if self.enabled else 'disable'} MIG mode"
        where = f"{self.gi.profile}@{self.gi.placement}"
        if self.action in (CREATE_CI, DESTROY_CI):
            name = ci_name(self.ci.slices, self.gi.slices, self.gi.profile)
            verb = "create" if self.action == CREATE_CI else "destroy"
            return f"{verb} compute instance {name} at {self.ci.placement} in {where}"
        verb = "create" if self.action == CREATE_GI else "destroy"
        return f"{verb} GPU instance {where}"

    def to_dict(self) -> dict:
        out = {"action": self.action, "gpu": self.gpu, "description": self.describe()}
        if self.gi is not None:
            out["gpu_instance"] = {"profile": self.gi.profile, "profile_id": self.gi.profile_id,
                                   "placement": str(self.gi.placement), "id": self.gi_id}
        if self.ci is not None:
            out["compute_instance"] = {"profile_id": self.ci.profile_id,
                                       "placement": str(self.ci.placement), "id": self.ci_id}
        if self.enabled is not None:
            out["enabled"] = self.enabled
        return out


@dataclass(frozen=True)
class GpuPlan:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    architecture: str
    before: Layout
    after: Layout
    mode_steps: tuple[Step, ...] = ()
    config_steps: tuple[Step, ...] = ()
    reset: bool = False             # the mode change takes effect only after a GPU reset
    # The driver lists MIG profiles only while MIG is enabled (R535): ``after`` is MIG
    # enabled with no instances, and the layout is planned once the mode change is done.
    deferred: bool = False

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.mode_steps + self.config_steps

    @property
    def changed(self) -> bool:
        return bool(self.steps) or self.reset

    def count(self, action: str) -> int:
        return sum(s.action == action for s in self.steps)

    def kept(self) -> int:
        """GPU instances that survive the change untouched or with only their CIs changed."""
        if not (self.before.enabled and self.after.enabled):
            return 0
        after = {g.key for g in self.after.gis}
        return sum(g.key in after for g in self.before.gis)

    def summary(self) -> str:
        if not self.changed:
            return "unchanged"
        parts = []
        if self.before.pending != self.after.pending or self.before.enabled != self.after.enabled:
            parts.append(("enable" if self.after.pending else "disable") + " MIG"
                         + (" (reset if left pending)" if self.reset else "")
                         + (" (pending reset)" if not self.after.settled else ""))
        for action, label in ((DESTROY_CI, "destroy {} CI"), (DESTROY_GI, "destroy {} GI"),
                              (CREATE_GI, "create {} GI"), (CREATE_CI, "create {} CI")):
            n = self.count(action)
            if n:
                parts.append(label.format(n))
        if self.kept():
            parts.append(f"keep {self.kept()} GI")
        if self.deferred:
            parts.append("then plan its layout (profiles are listed once MIG is enabled)")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "product": self.name,
                "pci_bus_id": self.pci_bus_id, "changed": self.changed, "reset": self.reset,
                "deferred": self.deferred,
                "summary": self.summary(), "before": self.before.to_dict(),
                "after": self.after.to_dict(), "steps": [s.to_dict() for s in self.steps]}


@dataclass(frozen=True)
class MigPlan:
    config: str
    gpus: tuple[GpuPlan, ...]
    mode_only: bool = False
    warnings: tuple[str, ...] = field(default=())
    unreadable: tuple = ()           # UnreadableGpu records the config selects (left alone)

    @property
    def changed(self) -> tuple[GpuPlan, ...]:
        return tuple(g for g in self.gpus if g.changed)

    @property
    def deferred(self) -> tuple[GpuPlan, ...]:
        return tuple(g for g in self.gpus if g.deferred)

    def then(self, second: "MigPlan") -> "MigPlan":
        """This plan with its deferred GPUs completed by ``second`` (planned after the mode
        change, for those GPUs and any this plan left out): one record of the whole apply."""
        by_uuid = {g.uuid: g for g in second.gpus}
        gpus = [replace(g, after=by_uuid[g.uuid].after, config_steps=by_uuid[g.uuid].config_steps,
                        deferred=False) if g.deferred and g.uuid in by_uuid else g for g in self.gpus]
        mine = {g.uuid for g in self.gpus}
        gpus += [g for g in second.gpus if g.uuid not in mine]
        return replace(self, gpus=tuple(sorted(gpus, key=lambda g: g.index)))

    @property
    def mode_changes(self) -> bool:
        return any(g.mode_steps or g.reset for g in self.gpus)

    @property
    def config_changes(self) -> bool:
        return any(g.config_steps or g.deferred for g in self.gpus)

    def to_dict(self) -> dict:
        return {"config": self.config, "mode_only": self.mode_only,
                "changed": [g.index for g in self.changed], "mode_changes": self.mode_changes,
                "config_changes": self.config_changes, "warnings": list(self.warnings),
                "unreadable": [u.index for u in self.unreadable],
                "gpus": [g.to_dict() for g in self.gpus]}


def _ids(gpu: Gpu) -> dict:
    """(GI profile id, start) -> (GI id, {(CI profile id, start): CI id}) of existing instances."""
    out = {}
    if gpu.mig:
        for gi in gpu.mig.gpu_instances:
            out[(gi.profile_id, gi.placement.start)] = (
                gi.id, {(c.profile_id, c.placement.start): c.id for c in gi.compute_instances})
    return out


def _destroy_all(gpu: Gpu, gis, ids) -> tuple[list[Step], list[Step]]:
    cis, gone = [], []
    for gi in gis:
        gi_id, ci_ids = ids[gi.key]
        cis += [Step(DESTROY_CI, gpu.index, gi, ci, gi_id=gi_id, ci_id=ci_ids[(ci.profile_id, ci.start)])
                for ci in gi.cis]
        gone.append(Step(DESTROY_GI, gpu.index, gi, gi_id=gi_id))
    return cis, gone


def diff(gpu: Gpu, before: Layout, after: Layout, *, reset_needed: bool) -> GpuPlan:
    """Steps from ``before`` (the GPU's current layout) to ``after``."""
    ids = _ids(gpu)
    mode: list[Step] = []
    config: list[Step] = []
    live = before.gis if before.enabled else ()
    if before.enabled and not after.enabled:
        cis, gis = _destroy_all(gpu, live, ids)       # the driver refuses to disable otherwise
        mode += cis + gis
        live = ()
    if before.pending != after.pending:
        mode.append(Step(SET_MODE, gpu.index, enabled=after.pending))
    reset = reset_needed and before.enabled != after.enabled

    if after.enabled:
        wanted = {g.key: g for g in after.gis}
        kept = {g.key: g for g in live if g.key in wanted}
        destroy_ci, destroy_gi = _destroy_all(gpu, [g for g in live if g.key not in kept], ids)
        create_gi, create_ci = [], []
        for key, old in sorted(kept.items()):
            new = wanted[key]
            gi_id, ci_ids = ids[key]
            old_cis, new_cis = set(old.cis), set(new.cis)
            destroy_ci += [Step(DESTROY_CI, gpu.index, old, ci, gi_id=gi_id,
                                ci_id=ci_ids[(ci.profile_id, ci.start)]) for ci in sorted(old_cis - new_cis)]
            create_ci += [Step(CREATE_CI, gpu.index, new, ci, gi_id=gi_id) for ci in sorted(new_cis - old_cis)]
        for key, new in sorted(wanted.items()):
            if key not in kept:
                create_gi.append(Step(CREATE_GI, gpu.index, new))
                create_ci += [Step(CREATE_CI, gpu.index, new, ci) for ci in new.cis]
        config = destroy_ci + destroy_gi + create_gi + create_ci
    return GpuPlan(index=gpu.index, uuid=gpu.uuid, name=gpu.name, pci_bus_id=gpu.pci_bus_id,
                   architecture=gpu.architecture, before=before, after=after,
                   mode_steps=tuple(mode), config_steps=tuple(config), reset=reset)


def affected_devices(inventory: Inventory, plan: MigPlan) -> set[str]:
    """UUIDs of devices a plan destroys or takes away: MIG devices whose compute instance it
    destroys, and every device of a GPU whose mode it changes."""
    out: set[str] = set()
    by_index = {g.index: g for g in inventory.gpus}
    for gp in plan.changed:
        gpu = by_index[gp.index]
        devices = gpu.mig.devices if gpu.mig else ()
        if any(s.action == SET_MODE for s in gp.steps) or gp.reset:
            out |= {gpu.uuid, *(d.uuid for d in devices)}
        for s in gp.steps:
            if s.action == DESTROY_CI:
                out |= {d.uuid for d in devices if (d.gi, d.ci) == (s.gi_id, s.ci_id)}
    return out
