"""The MIG operations as the CLI and the daemon call them: locking, crash recovery, hooks.

Every operation first finishes or rolls back an apply a crash interrupted. Mutations wait
for the node lock; read operations take it only briefly to recover, and when another
apply holds it they report the state as it is, with a note.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Callable

from ..devices import read_inventory
from ..devices.records import Inventory
from ..errors import StateError
from ..hostroot import HostRoot
from ..lock import node_lock
from ..model import mig_layout
from .journal import Journal, read_checkpoint
from .layout import Layout
from .plan import MigPlan
from .planner import PLAN_SECONDS, plan as make_plan
from .solver import Budget
from .spec import MigSpec

# The executor, recovery, hooks and the default-config generator are imported where they
# are needed: an apply with nothing to do (every boot, usually) stays a short process.

__all__ = ["ApplyResult", "apply", "plan", "check", "require_applied", "status", "recover_pending",
           "NotApplied"]

READ_LOCK_WAIT = 5.0


class NotApplied(StateError):
    code = "mig_not_applied"


Progress = Callable[[int | None, str], None]


def _quiet(gpu: int | None, message: str) -> None:
    pass


def _no_hook(host: HostRoot) -> None:
    pass


@dataclass
class ApplyResult:
    plan: MigPlan
    report: object | None = None               # executor.ApplyReport; None if nothing ran
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """What the CLI prints and the API answers after an apply."""
        report = self.report
        return {"plan": self.plan.to_dict(), "notes": list(self.notes),
                "changed": [g.index for g in self.plan.changed],
                "terminated": list(report.run.terminated) if report else [],
                "capability_nodes": {"created": list(report.nodes.created) if report else [],
                                     "removed": list(report.nodes.removed) if report else []}}


def _recover(host: HostRoot, progress: Progress, on_layout_changed) -> str | None:
    """Under the node lock: finish or roll back an interrupted apply, if any."""
    if not Journal.path(host).exists():      # the common case costs one stat
        return None
    from .recovery import recover
    return recover(host, progress=progress, on_layout_changed=on_layout_changed)


def recover_pending(host: HostRoot, *, wait: float | None = READ_LOCK_WAIT, progress: Progress = _quiet,
                    on_layout_changed: Callable[[HostRoot], None] = _no_hook) -> str | None:
    """Recover an interrupted apply if there is one; a note saying what happened, if anything."""
    if not Journal.path(host).exists():
        return None
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(node_lock(host, "mig recovery", timeout=wait))
        except StateError as e:
            return f"a MIG apply is in progress ({e.what}); showing the state as it is"
        return _recover(host, progress, on_layout_changed)


def _spec(spec: MigSpec | None, inventory) -> MigSpec:
    if spec is not None:
        return spec
    from .defaults import default_spec
    return default_spec(inventory)


def _first_plan(inventory: Inventory, spec: MigSpec | None, config: str | None, **options) -> MigPlan:
    """The plan to start from. A bundled config made of profile names (``all-balanced``)
    is unknown while a GPU lists no MIG profiles (drivers such as R535, with MIG disabled):
    those GPUs get MIG enabled first and the config is planned after the mode change."""
    chosen = _spec(spec, inventory)
    unlisted = {g.uuid for g in inventory.gpus if g.mig is not None and not g.mig.profiles}
    if spec is not None or config is None or config in chosen.configs or not unlisted:
        return make_plan(inventory, chosen, config, **options)
    options.pop("budget", None)
    enable = make_plan(inventory, chosen, "all-enabled", **options)
    mode_only = options.get("mode_only", False)
    gpus = tuple(g if mode_only else replace(g, deferred=True) for g in enable.gpus if g.uuid in unlisted)
    why = (f"GPU {', '.join(str(g.index) for g in gpus)} list no MIG profile while MIG is disabled "
           f"(this driver), so the bundled config '{config}' is planned once MIG is enabled on them")
    return replace(enable, config=config, gpus=gpus, warnings=(*enable.warnings, why))


def apply(host: HostRoot, spec: MigSpec | None, config: str | None, *, mode_only: bool = False,
          skip_reset: bool = False, force: bool = False, dry_run: bool = False,
          hooks=None, hook_env: dict[str, str] | None = None, progress: Progress = _quiet,
          on_layout_changed: Callable[[HostRoot], None] = _no_hook,
          lock_timeout: float | None = None, on_lock_wait: Callable[[str], None] | None = None,
          refuse: Callable[[Inventory, MigPlan], None] | None = None,
          stop_requested: Callable[[], bool] | None = None) -> ApplyResult:
    """Apply ``config`` of ``spec`` (None: the bundled default), with mig-parted's hooks
    (a ``hooks.Hooks``; None for none). Another apply in progress is waited for (GPU resets
    take minutes): as long as it takes, or ``lock_timeout`` seconds. ``refuse(inventory,
    plan)`` may raise to stop the apply before anything (hooks included) runs: devices of
    allocations are protected that way. Once ``stop_requested()`` is true the apply is
    interrupted before its next GPU's change (or reset) and rolled back (MigInterrupted),
    as Ctrl-C does."""
    with node_lock(host, f"mig apply {config or ''}".strip(), timeout=lock_timeout, on_wait=on_lock_wait):
        notes = []
        recovered = _recover(host, progress, on_layout_changed)
        if recovered:
            notes.append(recovered)
        inventory = read_inventory(host)
        result = ApplyResult(_first_plan(inventory, spec, config, mode_only=mode_only, skip_reset=skip_reset,
                                         budget=Budget(PLAN_SECONDS, stop_requested)),
                             notes=notes)
        if refuse is not None:
            refuse(inventory, result.plan)
        if dry_run:
            return result
        if not (hooks or result.plan.changed):
            return result                # the common case at boot: nothing to do, nothing loaded
        from .hooks import NO_HOOKS, around_apply
        hooks = hooks or NO_HOOKS
        env = {**(hook_env or {}), "MIG_PARTED_SELECTED_CONFIG": result.plan.config}
        with around_apply(hooks, env):
            if result.plan.changed:
                from .executor import execute
                result.report = execute(
                    host, inventory, result.plan, skip_reset=skip_reset, force=force,
                    progress=progress, before_phase=lambda phase: hooks.run(f"pre-apply-{phase}", env),
                    on_layout_changed=on_layout_changed, stop_requested=stop_requested,
                    replan=lambda now: _replan(now, spec, config, skip_reset, refuse, stop_requested))
                result.plan = result.report.plan       # with deferred layouts filled in
        return result


def _replan(inventory: Inventory, spec: MigSpec | None, config: str | None, skip_reset: bool, refuse,
            stop_requested=None) -> MigPlan:
    """After the mode change, with every profile table listed: the whole config, checked
    like the first plan."""
    second = make_plan(inventory, _spec(spec, inventory), config, skip_reset=skip_reset,
                       budget=Budget(PLAN_SECONDS, stop_requested))
    if refuse is not None:
        refuse(inventory, second)
    return second


def plan(host: HostRoot, spec: MigSpec | None, config: str | None, *, mode_only: bool = False,
         on_layout_changed: Callable[[HostRoot], None] = _no_hook,
         stop_requested: Callable[[], bool] | None = None) -> tuple[MigPlan, list[str]]:
    result, notes, _ = plan_with_inventory(host, spec, config, mode_only=mode_only,
                                           on_layout_changed=on_layout_changed, stop_requested=stop_requested)
    return result, notes


def plan_with_inventory(host: HostRoot, spec: MigSpec | None, config: str | None, *, mode_only: bool = False,
                        on_layout_changed: Callable[[HostRoot], None] = _no_hook,
                        stop_requested: Callable[[], bool] | None = None):
    """``plan``, with the inventory it was made from (to tell which devices it takes away)."""
    note = recover_pending(host, on_layout_changed=on_layout_changed)
    inventory = read_inventory(host)
    return (_first_plan(inventory, spec, config, mode_only=mode_only,
                        budget=Budget(PLAN_SECONDS, stop_requested)), [note] if note else [], inventory)


def check(host: HostRoot, spec: MigSpec | None, config: str | None, *, mode_only: bool = False) -> MigPlan:
    """mig-parted's ``assert``: raises NotApplied unless nothing would change."""
    result, _ = plan(host, spec, config, mode_only=mode_only)
    require_applied(result)
    return result


def require_applied(result: MigPlan) -> None:
    """NotApplied unless the plan changes nothing and every GPU it selects could be read."""
    if result.unreadable:
        raise NotApplied("assertion failure: selected configuration not currently applied: "
                         + "; ".join(f"GPU {u.index} cannot be read ({u.error})" for u in result.unreadable),
                         hint="the config selects it, so it cannot be checked; 'hostagent devices' "
                              "shows the GPUs NVML can read")
    if result.changed:
        raise NotApplied("assertion failure: selected configuration not currently applied",
                         hint=f"GPU {', '.join(str(g.index) for g in result.changed)} differ; "
                              "'hostagent mig plan' shows what applying would change")


def status(host: HostRoot, *, on_layout_changed: Callable[[HostRoot], None] = _no_hook) -> dict:
    note = recover_pending(host, on_layout_changed=on_layout_changed)
    inventory = read_inventory(host)
    gpus = [mig_layout(gpu, None if gpu.mig is None else Layout.of(gpu)) for gpu in inventory.gpus]
    journal = Journal.load(host)
    checkpoint = read_checkpoint(host)
    return {"gpus": gpus,
            "apply_in_progress": None if journal is None else {
                "config": journal.record.config, "status": journal.record.status,
                "started": journal.record.started, "pid": journal.record.pid},
            "checkpoint": None if checkpoint is None else {
                "created": checkpoint.get("created"), "config": checkpoint.get("config")},
            "notes": [note] if note else []}
