"""MIG layouts from mig-parted config files: a pure planner with explicit placements and
minimal disruption, and an all-or-nothing executor with checkpoint, journal and rollback.

    spec       v1 config files (mig-parted's format), validated while parsing
    defaults   the bundled default config, generated from the GPUs present
    profiles   profile-name grammar and compute-instance shapes
    quirks     corrections for what NVML reports wrongly (A30 instance counts)
    layout     exact layouts (mode, placements): checkpoint, target and recovery records
    solver     exact placement search for one GPU
    planner    (inventory, spec, config) -> MigPlan, and restore plans
    plan       the plan records and the diff between two layouts
    runner     NVML steps phase by phase, resets, in-use checks
    executor   checkpoint, journal, verify, rollback, capability nodes
    recovery   rollback and crash recovery from the journal
    hooks      mig-parted hooks files
    service    the operations with locking and recovery, as the CLI and daemon call them
"""

from .planner import PlanError, plan, restore_plan
from .spec import ConfigEntry, DeviceFilter, MigSpec, load_spec, parse_spec

__all__ = ["plan", "restore_plan", "PlanError", "MigSpec", "ConfigEntry", "DeviceFilter",
           "load_spec", "parse_spec"]
