"""The pure planner: (inventory, spec, config name) -> MigPlan.

Every targeted GPU is resolved and solved before anything is touched, so an unknown
profile name or a layout that cannot fit fails the whole plan with every problem named,
and the executor never starts a change it cannot finish. (One exception: on drivers that
list MIG profiles only while MIG is enabled, a GPU being enabled is planned in two steps,
the layout after the mode change; a failure there rolls the mode change back.) Minimal
disruption comes from
two places: a GPU whose instances already give the requested devices is left alone, and
on a changing GPU the solver's cost keeps instances whose profile and placement match.
"""

from __future__ import annotations

from dataclasses import replace

from ..devices.records import Gpu, Inventory
from ..errors import ConfigError, UsageError
from .layout import Layout
from .plan import MigPlan, diff
from .profiles import ci_shapes, parse_profile
from .quirks import mig_profiles
from .solver import Budget, Geometry, solve
from .spec import ConfigEntry, MigSpec

__all__ = ["plan", "restore_plan", "PlanError", "needs_reset", "resolve", "PLAN_SECONDS"]

# What one planner call may spend searching placements, over all its GPUs. Real layouts
# take milliseconds; the budget only bounds a hostile or mistaken request.
PLAN_SECONDS = 10.0


class PlanError(ConfigError):
    """The selected config cannot be applied to this node; nothing was changed. Exit 2 when
    it names a MIG profile the GPUs do not have (an unknown name, as the CLI's other usage
    errors), 1 when what it asks does not fit them."""
    code = "mig_plan_error"


class _UnknownProfile(ValueError):
    """A profile name the GPU's own table does not have."""


def needs_reset(gpu: Gpu) -> bool:
    """Ampere keeps a new MIG mode pending until a GPU reset; Hopper and newer switch at once."""
    return int(gpu.compute_capability.split(".")[0]) < 9


def resolve(gpu: Gpu, entry: ConfigEntry) -> tuple[dict[int, list[int]], dict[str, int]]:
    """Profile names against this GPU's own table: (GI profile id -> CI slice counts,
    canonical name -> count). ValueError says what is wrong (not which GPU: the planner
    groups GPUs with the same problem) and names the profiles the GPU does have."""
    profiles = {p.name: p for p in gpu.mig.profiles}
    limits = {p.id: p.instances for p in mig_profiles(gpu)}      # with the A30's counts fixed
    request: dict[int, list[int]] = {}
    counts: dict[str, int] = {}
    for name, count in entry.mig_devices:
        if count == 0:
            continue
        pn = parse_profile(name)
        prof = profiles.get(pn.gi_name)
        if prof is None:
            raise _UnknownProfile(f"no MIG profile '{name}'; the profiles are {', '.join(profiles)} "
                             "(and <C>c.<profile> compute-instance forms)")
        sizes = [s.slices for s in ci_shapes(prof.slices)]
        if pn.c not in sizes:
            raise ValueError(f"'{name}': a {prof.name} GPU instance offers compute instances of "
                             f"{', '.join(f'{c}c' for c in sizes)} only")
        instances = limits.get(prof.id, prof.instances)
        if count > instances * (prof.slices // pn.c):   # refused before a list that long is built
            raise ValueError(f"{count}x {pn} need more than the {instances} {prof.name} GPU "
                             f"instance{'s' * (instances != 1)} the GPU allows")
        request.setdefault(prof.id, []).extend([pn.c] * count)
        counts[str(pn)] = counts.get(str(pn), 0) + count
    return request, counts


def _entry_for(gpu: Gpu, entries: tuple[ConfigEntry, ...]) -> ConfigEntry | None:
    """The entry that decides this GPU's layout. mig-parted applies every matching entry in
    turn, so the last one wins: a file may set defaults, then override some GPUs."""
    found = [e for e in entries if e.selects(gpu.index, gpu.pci_device_id, gpu.pci_subsystem_id)]
    return found[-1] if found else None


def _missing_indices(inventory: Inventory, entries: tuple[ConfigEntry, ...]) -> list[str]:
    """Entries naming GPU indices this node does not have (mig-parted ignores them silently,
    which hides a typo or a config written for another node). An entry whose device-filter
    matches no GPU here is for other nodes (a file shared by a fleet): its indices are not
    this node's business, as in mig-parted."""
    present = {g.index for g in inventory.gpus} | {u.index for u in inventory.unreadable}
    out = []
    for i, e in enumerate(entries):
        if e.device_filter and not inventory.unreadable and not any(
                f.matches(g.pci_device_id, g.pci_subsystem_id) for f in e.device_filter for g in inventory.gpus):
            continue
        missing = [d for d in (() if e.devices == "all" else e.devices) if d not in present]
        if missing:
            out.append(f"entry {i} names GPU {', '.join(map(str, missing))}, but this node has GPU "
                       f"{_indices(sorted(present)) or 'none'}")
    return out


def _indices(indices: list[int]) -> str:
    """0, 1, 2, 3, 5 -> '0-3, 5'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _grouped(problems: dict[str, list[Gpu]]) -> list[str]:
    """One sentence per problem, naming every GPU that has it."""
    out = []
    for text, gpus in problems.items():
        names = ", ".join(dict.fromkeys(g.name for g in gpus))
        out.append(f"GPU {_indices([g.index for g in gpus])} ({names}): {text}")
    return out


# The target of a GPU whose driver lists MIG profiles only while MIG is enabled (R535, as
# mig.md 1.1 says): enable MIG now, plan the instances after the mode change.
DEFERRED = Layout(True, True, ())


def _target(gpu: Gpu, before: Layout, entry: ConfigEntry, *, mode_only: bool,
            skip_reset: bool, budget: Budget) -> Layout:
    want = entry.mig_enabled
    if skip_reset and needs_reset(gpu) and before.enabled != want:
        if not mode_only:
            raise UsageError(f"GPU {gpu.index} ({gpu.name}) needs a GPU reset for its MIG mode "
                             "change, so --skip-reset leaves no way to create its instances",
                             hint="use --skip-reset with --mode-only, or drop --skip-reset")
        # Ampere with --skip-reset: the new mode waits for the next reset or reboot.
        return Layout(before.enabled, want, ())
    if not want:
        return Layout(False, False, ())
    if mode_only:
        return Layout(True, True, before.gis if before.enabled else ())
    if not gpu.mig.profiles and any(count for _, count in entry.mig_devices):
        return DEFERRED                        # planned once MIG is enabled (see plan())
    request, counts = resolve(gpu, entry)
    if not request:
        return Layout(True, True, ())           # MIG on, no instances
    live = before.gis if before.enabled else ()
    if before.enabled and all(gi.cis for gi in live) and before.counts() == counts:
        return Layout(True, True, live)        # already gives the requested devices
    return Layout(True, True, solve(Geometry.of(mig_profiles(gpu)), request, live, budget))


def plan(inventory: Inventory, spec: MigSpec, config: str | None = None, *,
         mode_only: bool = False, skip_reset: bool = False, budget: Budget | None = None) -> MigPlan:
    """What applying ``config`` changes, per GPU; raises PlanError naming every problem.
    The placement searches of all GPUs share ``budget`` (default: PLAN_SECONDS)."""
    name, entries = spec.select(config)
    budget = budget or Budget(PLAN_SECONDS)
    problems: dict[str, list[Gpu]] = {}
    unknown_profile = False
    gpus = []
    warnings = [f"GPU {u.index} cannot be read ({u.error}); it is left alone" for u in inventory.unreadable]
    # Its PCI id is unknown too, so a device-filter cannot rule it out: selected by index.
    unreadable = tuple(u for u in inventory.unreadable
                       if any(e.devices == "all" or u.index in e.devices for e in entries))
    for gpu in inventory.gpus:
        entry = _entry_for(gpu, entries)
        if entry is None:
            continue
        try:
            if gpu.mig is None:
                if entry.mig_enabled:
                    raise ValueError("not MIG capable")
                continue
            before = Layout.of(gpu)
            after = _target(gpu, before, entry, mode_only=mode_only, skip_reset=skip_reset,
                            budget=budget)
            planned = diff(gpu, before, after, reset_needed=needs_reset(gpu) and not skip_reset)
            gpus.append(replace(planned, deferred=True) if after is DEFERRED else planned)
        except ValueError as e:
            problems.setdefault(str(e), []).append(gpu)
            unknown_profile |= isinstance(e, _UnknownProfile)
    found = _missing_indices(inventory, entries) + _grouped(problems)
    if found:
        error = PlanError(f"config '{name}' cannot be applied: " + "; ".join(found),
                          where=spec.source, hint="nothing was changed")
        if unknown_profile:
            error.exit_code = 2
        raise error
    return MigPlan(config=name, gpus=tuple(gpus), mode_only=mode_only, warnings=tuple(warnings),
                   unreadable=unreadable)


def restore_plan(inventory: Inventory, layouts: dict[str, Layout], *, skip_reset: bool = False,
                 label: str = "checkpoint") -> MigPlan:
    """Steps back to exact layouts (by GPU UUID): rollback and crash recovery."""
    gpus, warnings = [], []
    by_uuid = {g.uuid: g for g in inventory.gpus}
    for uuid, target in layouts.items():
        gpu = by_uuid.get(uuid)
        if gpu is None or gpu.mig is None:
            warnings.append(f"{uuid} is not readable; its layout cannot be restored")
            continue
        before = Layout.of(gpu)
        if not target.settled and before.enabled != target.enabled:
            # A mode change that was pending before we started cannot be re-created after a
            # reset without a second one; restore the mode that was in effect.
            warnings.append(f"GPU {gpu.index}: its pending MIG mode change was dropped")
            target = Layout(target.enabled, target.enabled, target.gis)
        gpus.append(diff(gpu, before, target, reset_needed=needs_reset(gpu) and not skip_reset))
    return MigPlan(config=label, gpus=tuple(gpus), warnings=tuple(warnings))
