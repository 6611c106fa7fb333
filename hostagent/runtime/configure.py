"""``runtime configure`` and ``runtime revert``: plan (read + render + diff), then apply.

Planning reads the engine's sources and current destinations and renders the new files;
it writes nothing, so ``--dry-run`` is the plan printed. Applying records what revert
needs (``backups``: each file as it was before hostagent first changed it) and writes all
of them or none (``files.write``).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..fileio import remove_stale_temporaries
from . import backups, files
from .engine import Settings, configure

__all__ = ["DEFAULT", "ENGINES", "Plan", "plan_configure", "apply_plan", "plan_revert", "apply_revert",
           "backup_folder", "absolute_path"]

DEFAULT = "default"     # --drop-in not given: the engine's default drop-in (if it has any)


def _containerd():
    from . import containerd
    return containerd


def _crio():
    from . import crio
    return crio


def _docker():
    from . import docker
    return docker


# name -> module with DEFAULT_CONFIG, SERVICE, DROP_IN_NAME (the default drop-in, relative to
# the main file's folder; None: no drop-ins) and build(reader, config, drop_in, explicit=...) -> Engine;
# each imported when used.
ENGINES = {"containerd": _containerd, "crio": _crio, "docker": _docker}


@dataclass
class Plan:
    runtime: str
    service: str
    changes: list[files.Change]
    notes: list[str] = field(default_factory=list)
    config: str = ""
    socket: str = ""          # containerd's gRPC socket, when its config names one
    created_dirs: list[str] = field(default_factory=list)    # revert: folders configure made
    targets: list[Path] = field(default_factory=list)        # every file rendered, changed or not


def absolute_path(path: str, flag: str, hint: str | None = None) -> str:
    """``path``, normalized; UsageError naming ``flag`` when it is relative."""
    if not posixpath.isabs(path):
        raise UsageError(f"{flag} must be an absolute path, not {path!r}", hint=hint)
    return posixpath.normpath(path)


def _default_drop_in(mod, config: str) -> str | None:
    """The engine module's drop-in beside the main file ``config``; None if it has none."""
    return posixpath.join(posixpath.dirname(config), mod.DROP_IN_NAME) if mod.DROP_IN_NAME else None


def plan_configure(host, runtime: str, settings: Settings, *, config: str | None = None,
                   drop_in: str | None = DEFAULT) -> Plan:
    if runtime not in ENGINES:
        raise UsageError(f"unknown runtime {runtime!r}", hint=f"one of {', '.join(ENGINES)}")
    mod = ENGINES[runtime]()
    config = absolute_path(config or mod.DEFAULT_CONFIG, "--config")
    explicit = drop_in != DEFAULT
    if not explicit:
        drop_in = _default_drop_in(mod, config)
    if drop_in:
        drop_in = absolute_path(drop_in, "--drop-in")
    reader = files.Reader(host)
    engine = mod.build(reader, config, drop_in, explicit=explicit)
    rendered = configure(engine, settings)
    snapshots = {path: reader.snapshot(path) for path in rendered}
    changes = files.changes(snapshots, rendered, make_parent={engine.drop_in})
    files.check_directories(changes)
    return Plan(runtime, mod.SERVICE, changes, engine.notes, config, getattr(engine, "socket", ""),
                targets=[s.real for s in snapshots.values()])


def backup_folder(host, runtime: str, backup_dir: str | None = None) -> Path:
    return Path(backup_dir) / runtime if backup_dir else host.state_dir / "runtime-backups" / runtime


def apply_plan(plan: Plan, folder: Path, *, before_rename=None) -> list[str]:
    """Write the plan's files, recording in ``folder`` what ``revert`` needs. Returns
    notes for the user."""
    if not plan.changes:                 # nothing to write: what killed writers left goes all the same
        for path in plan.targets:
            remove_stale_temporaries(str(path.parent), path.name)
        return []
    notes, undo = backups.record(folder, plan.changes)
    try:
        files.write(plan.changes, before_rename=before_rename)
    except BaseException:
        undo()
        raise
    return notes


def plan_revert(host, runtime: str, folder: Path, *, force: bool = False) -> Plan:
    if runtime not in ENGINES:
        raise UsageError(f"unknown runtime {runtime!r}", hint=f"one of {', '.join(ENGINES)}")
    changes, created_dirs = backups.restore_plan(folder, host, force=force)
    return Plan(runtime, ENGINES[runtime]().SERVICE, changes, created_dirs=created_dirs)


def apply_revert(plan: Plan, folder: Path) -> list[str]:
    """Restore the files, then remove the folders configure created (if empty) and the
    backup. Returns the folders removed."""
    files.write(plan.changes)
    return backups.finish_restore(folder, plan.created_dirs)
