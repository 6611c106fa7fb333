"""The driver installer's executor: runs a plan's steps one by one, each journaled before
and after, and rolls back to the packages it replaced when the new driver does not verify.

Steps that change nothing on the host come first (the agent's maintenance, the GPU users
check); a failure before the package step puts back what was stopped and leaves the
packages alone. A failure from the package step on (install, hold, load, verify) rolls
back: the previous packages are installed and held again, the modules reloaded and the
driver verified once more.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable

from .. import faults
from ..errors import HostagentError, StateError
from ..hostroot import HostRoot
from .journal import Journal, write_history
from .plan import InstallPlan, Step
from .system import Runner

__all__ = ["Installer", "Outcome", "InstallFailed"]

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
# Steps after which the packages differ from what the run started with.
CHANGING = ("unhold", "install", "hold", "load-modules", "create-nodes", "start-services", "verify")


class InstallFailed(StateError):
    code = "driver_install_failed"


@dataclass
class Outcome:
    plan: InstallPlan
    ok: bool = False
    rolled_back: bool = False
    verdict: dict | None = None          # the last driver verify -o json
    error: str | None = None
    steps: list = field(default_factory=list)   # (step, result)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "operation": self.plan.operation, "version": self.plan.version,
                "previous": self.plan.previous, "rolled_back": self.rolled_back, "error": self.error,
                "steps": [{"step": s, "result": r} for s, r in self.steps],
                "verdict": self.verdict}


class Installer:
    """``agent``: the daemon's client while one runs (maintenance through its API).
    ``replan_rollback(plan)``: the rollback plan for ``plan``'s previous packages, from
    fresh facts (the CLI gathers them)."""

    def __init__(self, host: HostRoot, *, agent=None, force: bool = False, ignore=(),
                 progress: Progress = lambda line: None, replan_rollback=None):
        self.host = host
        self.runner = Runner(host)
        self.agent = agent
        self.force = force
        self.ignore = tuple(ignore)
        self.progress = progress
        self.replan_rollback = replan_rollback
        self._stopped: list = []           # services this run stopped
        self._allocations: list = []       # the agent's, when maintenance began

    # ---- the run ------------------------------------------------------------------------

    def run(self, plan: InstallPlan, journal: Journal | None = None) -> Outcome:
        """Run ``plan`` (``journal``: an interrupted run's, to resume)."""
        outcome = Outcome(plan)
        resumed = journal is not None
        if journal is None:
            journal = Journal.begin(self.host, plan)
        else:
            journal.adopt()
        if journal.record["status"] == "rolling-back" and journal.rollback_plan is not None:
            return self._resume_rollback(journal, outcome)
        done = set(journal.record["done"]) if resumed else set()
        try:
            self._steps(plan, journal, outcome, skip=done - {"maintenance"})
        except HostagentError as e:
            return self._failed(plan, journal, outcome, e)
        self._end_maintenance()
        journal.finish()
        write_history(self.host, plan)
        outcome.ok = True
        return outcome

    def _steps(self, plan: InstallPlan, journal: Journal, outcome: Outcome, skip=frozenset(),
               only: tuple[str, ...] | None = None) -> None:
        for step in plan.steps:
            if step.name in skip or (only is not None and step.name not in only):
                continue
            self.progress(f"{step.name}: {step.title}")
            journal.step(step.name, done=False)
            faults.point(f"driver:before_{step.name}")
            getattr(self, "_" + step.name.replace("-", "_"))(step, plan, outcome)
            journal.step(step.name, done=True)
            outcome.steps.append((step.name, "done"))
            faults.point(f"driver:after_{step.name}")

    def _failed(self, plan: InstallPlan, journal: Journal, outcome: Outcome, error: HostagentError) -> Outcome:
        outcome.error = error.message
        outcome.steps.append((journal.record["current"] or "?", "failed"))
        changed = any(s in CHANGING for s in journal.record["done"]) or journal.record["current"] in CHANGING
        if not changed:                  # nothing on the host changed: put back what was stopped
            self.progress(f"failed before anything changed: {error.message}")
            self._start_stopped(plan)
            self._end_maintenance()
            journal.finish()
            return outcome
        if self.replan_rollback is None or plan.operation == "rollback":
            journal.fail(error.message)
            self._end_maintenance()
            raise InstallFailed(f"{plan.operation} of the driver {plan.version} failed and was not rolled "
                                f"back: {error.message}", where=str(Journal.path(self.host)),
                                hint="see 'hostagent driver verify'; the journal says which step ran")
        self.progress(f"{plan.operation} failed: {error.message}; rolling back to {plan.previous or 'the previous packages'}")
        try:
            rollback = self.replan_rollback(plan)
        except HostagentError as e:
            journal.fail(f"{error.message}; no rollback: {e.message}")
            self._end_maintenance()
            raise InstallFailed(f"the driver {plan.version} failed ({error.message}) and cannot be rolled "
                                f"back: {e.message}", where=str(Journal.path(self.host)), hint=e.hint) from None
        journal.rolling_back(rollback, error.message)
        return self._resume_rollback(journal, outcome)

    def _resume_rollback(self, journal: Journal, outcome: Outcome) -> Outcome:
        rollback = journal.rollback_plan
        outcome.rolled_back = True
        outcome.error = outcome.error or journal.record.get("error")
        done = set(journal.record["done"])
        try:
            self._steps(rollback, journal, outcome, skip=done | {"maintenance", "check-users", "resume"})
        except HostagentError as e:
            journal.fail(f"{outcome.error}; the rollback failed too: {e.message}")
            self._end_maintenance()
            raise InstallFailed(f"the driver {journal.plan.version} failed ({outcome.error}) and the rollback "
                                f"to {rollback.version} failed too: {e.message}",
                                where=str(Journal.path(self.host)),
                                hint="see 'hostagent driver verify'; the journal says which step ran") from None
        self._end_maintenance()
        journal.finish()
        write_history(self.host, rollback)
        return outcome

    # ---- steps --------------------------------------------------------------------------

    def _maintenance(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        if self.agent is None:
            return
        answer = self.agent.request("POST", "/v1/driver/maintenance",
                                    {"pid": os.getpid(), "operation": f"driver {plan.operation} {plan.version}"}).json()
        self._allocations = answer.get("allocations", [])

    def _check_users(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        from .nodestate import gpu_processes
        users = [f"allocation {a}" for a in self._allocations] + gpu_processes(self.host)
        if users and not self.force:
            raise StateError(f"{len(users)} user(s) of the GPUs remain: {'; '.join(users[:10])}",
                             hint="release them (or drain the node), or pass --force to go on")
        for user in users:
            self.progress(f"  going on although {user} uses a GPU (--force)")

    def _stop_services(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        for service in plan.services:
            if service.unit:
                self.runner.run(["systemctl", "stop", service.unit])
            else:
                _terminate(self.host, service)
            self._stopped.append(service)

    def _commands(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        for command in step.commands:
            self.runner.run(list(command))

    _unload_modules = _unhold = _install = _hold = _commands

    def _load_modules(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        first, *others = step.commands
        self.runner.run(list(first))              # nvidia itself must load
        for command in others:                    # its helpers may be absent from a build
            result = self.runner.run(list(command), check=False)
            if not result.ok:
                self.progress(f"  {' '.join(command)}: {result.last_line()}")

    def _create_nodes(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        from .nodes import create_missing
        for path in create_missing(self.host):
            self.progress(f"  created {path}")

    def _start_services(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        self._start_stopped(plan, every=True)

    def _start_stopped(self, plan: InstallPlan, every: bool = False) -> None:
        for service in (plan.services if every else self._stopped):
            command = ["systemctl", "start", service.unit] if service.unit else list(service.start)
            if not command:
                continue
            result = self.runner.run(command, check=False)
            if not result.ok:
                self.progress(f"  {' '.join(command)}: {result.last_line()}")
        self._stopped = []

    def _verify(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        """In a new process: this one may hold the previous NVML library."""
        argv = [sys.executable, "-m", "hostagent.cli.main"]
        if self.host.simulated:
            argv += ["--simulate", str(self.host.root)]
        argv += ["driver", "verify", "-o", "json", *(f"--ignore={c}" for c in self.ignore)]
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        try:
            outcome.verdict = json.loads(proc.stdout)
        except ValueError:
            raise StateError(f"driver verify did not answer: {proc.stderr.strip()[-300:]}") from None
        if not outcome.verdict["usable"]:
            raise StateError(f"the driver {plan.version} does not verify: {outcome.verdict['reason']}")

    def _resume(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        self._end_maintenance()

    def _restart_agent(self, step: Step, plan: InstallPlan, outcome: Outcome) -> None:
        """The new daemon loads the new NVML library, starts out of maintenance and verifies
        the driver. A restart that fails is said, not rolled back (the driver verified); the
        daemon then just leaves maintenance."""
        for command in step.commands:
            result = self.runner.run(list(command), check=False)
            if not result.ok:
                self.progress(f"  {' '.join(command)}: {result.last_line()}; restart the hostagent daemon "
                              "by hand so it loads the new NVML library")
                return
        self.agent = None            # the process that was in maintenance is gone

    def _end_maintenance(self) -> None:
        if self.agent is None:
            return
        try:
            self.agent.request("DELETE", "/v1/driver/maintenance")
        except HostagentError as e:
            self.progress(f"  the agent did not leave maintenance: {e.message}")


def _terminate(host, service, timeout: float = 30) -> None:
    """SIGTERM to the daemon its pid file named, once that process is seen to run the
    daemon's program (a pid file is the daemon's to write, and a pid may be reused)."""
    from .. import processes
    rec = processes.record(service.pid)
    if rec is None:
        return
    program = service.start[0] if service.start else service.name
    path = host.driver_tool(program)
    try:
        expected = processes.program(str(path)) if path is not None else None
    except OSError:
        expected = None
    argv = _cmdline(rec.pid)
    if expected is None or rec.exe != expected.exe or (expected.script is not None and expected.script not in argv):
        raise StateError(f"process {rec.pid}, named by the pid file of {service.name}, does not run {program}: "
                         "not stopped", hint=f"stop {service.name} yourself, then run the install again")
    processes.send(rec, signal.SIGTERM)
    if not processes.wait_gone(rec, timeout):
        raise StateError(f"process {rec.pid} did not stop within {timeout:g} s")


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read(1 << 16).split(b"\0") if a]
    except OSError:
        return []
