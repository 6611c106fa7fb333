"""``driver plan``, ``install`` and ``rollback`` end to end: the checks that refuse bad input
before anything changes, the facts the planner needs, the plan, and the installer."""

from __future__ import annotations

import os

from ..errors import NotFoundError, PermissionDenied, StateError
from ..hostroot import HostRoot
from .distro import Distro, read_distro
from .install import Installer, Outcome
from .journal import Journal, read_history
from .packages import gather
from .plan import InstallPlan, check_version, plan_install, plan_restore, wanted_names
from .system import Runner

__all__ = ["make_plan", "rollback_plan", "install", "rollback", "pending_journal", "require_root"]


def require_root(what: str, host: HostRoot) -> None:
    """Root, on a host; a simulated node's packages and modules are its owner's files, changed
    by the simulator's tools."""
    if os.geteuid() != 0 and not (host.simulated and not host.mounted):
        raise PermissionDenied(f"{what} needs root: it installs packages and loads kernel modules")


def pending_journal(host: HostRoot) -> Journal | None:
    """An interrupted run's journal; StateError while its process still runs."""
    journal = Journal.load(host)
    if journal is not None and journal.alive:
        raise StateError(f"another driver operation is running: {journal.describe()}",
                         where=str(Journal.path(host)), hint="wait for it to finish")
    return journal


def _context(host: HostRoot, agent) -> tuple[Distro, Runner, list, frozenset]:
    distro = read_distro(host)
    runner = Runner(host)
    tool = "dnf" if distro.manager == "dnf" else "apt-get"
    if not runner.has(tool):
        raise NotFoundError(f"{distro.name} without {tool}: the driver's packages cannot be managed",
                            where=str(host.root), hint=f"install {tool}")
    allocations = [a["id"] for a in agent.get("/v1/allocations")["allocations"]] if agent else []
    history = read_history(host) or {}
    return distro, runner, allocations, frozenset(history.get("held", ()))


def _facts(host, distro, runner, version, allocations, agent, holds):
    from .nodestate import read_node_state
    node = read_node_state(host, runner, allocations=allocations, agent=agent is not None, our_holds=holds)
    pkgs = gather(runner, distro.manager, wanted_names(distro, version, node))
    return node, pkgs


def make_plan(host: HostRoot, version: str, *, flavour: str = "auto", agent=None) -> InstallPlan:
    version = check_version(version)
    distro, runner, allocations, holds = _context(host, agent)
    node, pkgs = _facts(host, distro, runner, version, allocations, agent, holds)
    return plan_install(distro, pkgs, node, version, flavour=flavour)


def rollback_plan(host: HostRoot, packages, version: str, flavour: str, *, agent=None) -> InstallPlan:
    distro, runner, allocations, holds = _context(host, agent)
    node, pkgs = _facts(host, distro, runner, version, allocations, agent, holds)
    holds = holds | {n for n, _ in packages if n in pkgs.held}      # what the failed run just held
    from dataclasses import replace
    return plan_restore(distro, pkgs, replace(node, our_holds=frozenset(holds)), packages, version, flavour)


def _previous(plan: InstallPlan) -> tuple[list, str]:
    from .packages import upstream
    packages = list(plan.previous_packages)
    version = next((upstream(v) for n, v in packages if n in ("nvidia-driver", "cuda-drivers", "nvidia-open")
                    or n.startswith("nvidia-driver-")), plan.previous or "the previous version")
    return packages, version


def _installer(host, agent, force, ignore, progress) -> Installer:
    def replan(failed: InstallPlan) -> InstallPlan:
        packages, version = _previous(failed)
        if not packages:
            raise NotFoundError("no driver packages were installed before")
        return rollback_plan(host, packages, version, failed.flavour, agent=agent)
    return Installer(host, agent=agent, force=force, ignore=ignore, progress=progress, replan_rollback=replan)


def install(host: HostRoot, version: str, *, flavour="auto", force=False, ignore=(), agent=None,
            progress=lambda line: None) -> Outcome:
    version = check_version(version)
    require_root("driver install", host)
    journal = pending_journal(host)
    installer = _installer(host, agent, force, ignore, progress)
    if journal is not None:
        if journal.plan.version != version or journal.plan.operation != "install":
            raise StateError(f"{journal.describe()} was interrupted", where=str(Journal.path(host)),
                             hint=f"finish it ('hostagent driver install --version {journal.plan.version}') or "
                                  "roll it back ('hostagent driver rollback') first")
        progress(f"resuming {journal.describe()}")
        return installer.run(journal.plan, journal)
    return installer.run(make_plan(host, version, flavour=flavour, agent=agent))


def rollback(host: HostRoot, *, force=False, ignore=(), agent=None, dry_run=False,
             progress=lambda line: None) -> Outcome | InstallPlan:
    """Back to what the last install replaced (or, after an interrupted run, to what it started from)."""
    if not dry_run:
        require_root("driver rollback", host)
    journal = pending_journal(host)
    if journal is not None:
        if journal.record["status"] == "rolling-back":
            if dry_run:
                return journal.rollback_plan
            progress(f"resuming the rollback of {journal.describe()}")
            return _installer(host, agent, force, ignore, progress).run(journal.plan, journal)
        source = journal.plan
    else:
        history = read_history(host)
        if not history or not history.get("previous_packages"):
            raise NotFoundError("no earlier driver install is recorded: nothing to roll back to",
                                hint="install a version with 'hostagent driver install --version V'")
        source = InstallPlan.from_dict({
            "operation": "install", "distro": "", "manager": "", "version": history["driver_version"],
            "previous": history.get("previous_version"), "flavour": history["flavour"], "packages": [],
            "previous_packages": history["previous_packages"], "hold": [], "unhold": [], "steps": [],
            "users": [], "notes": [], "services": []})
    packages, version = _previous(source)
    plan = rollback_plan(host, packages, version, source.flavour, agent=agent)
    if dry_run:
        return plan
    if journal is not None:
        journal.finish()             # the interrupted run is superseded by this rollback
    return _installer(host, agent, force, ignore, progress).run(plan)
