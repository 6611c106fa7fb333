"""``POST /v1/driver/install``: the agent installs a driver version for an API client that
never touches the driver itself (the node controller's fleet upgrade), and ``GET
/v1/driver/install`` says how it goes.

The install is ``hostagent driver install --version V --report FILE`` (journaled, verified,
rolled back on failure: driver.md), run in a process of its own, never in the agent:

- under systemd, in a transient unit (``systemd-run``): outside the agent's sandbox, where
  the package manager and ``modprobe`` can work, and outside its cgroup, so the install's
  last step may restart ``hostagent.service``;
- otherwise in a session of its own, its output in ``<state>/driver/install.log``: it
  outlives the agent too.

The agent keeps nothing of it in memory. The report FILE (``<state>/driver/install.json``)
and the driver journal say what runs and how it ended, to this agent and to the next one
after a restart. A report whose process is gone before its end is ``interrupted``: asking
for the same version again resumes the journal. A version the verified driver already has is
not installed again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading

from .. import processes
from ..errors import ConflictError, StateError
from ..fileio import ensure_dir

__all__ = ["DriverInstalls", "InstallUnavailable"]

log = logging.getLogger("hostagent.daemon")

REPORT, LOG = "install.json", "install.log"
RUNNING = ("starting", "running")


class InstallUnavailable(StateError):
    code = "driver_install_unavailable"


class DriverInstalls:
    def __init__(self, agent):
        self.agent = agent
        self.host = agent.host
        self.lock = asyncio.Lock()

    @property
    def folder(self):
        from ..driver.journal import driver_state_dir
        return driver_state_dir(self.host)

    def view(self) -> dict:
        """The last install started through the API (or ``none``), as it stands; worker."""
        from ..driver.journal import Journal
        from ..driver.report import judge, read
        report = judge(read(self.folder / REPORT)) or {"state": "none", "version": None, "process": None,
                                                       "started_at": None, "finished_at": None, "progress": None,
                                                       "error": None, "outcome": None}
        try:
            journal = Journal.load(self.host)
            journal = journal.describe() if journal is not None else None
        except StateError as e:
            journal = e.message
        log_path = self.folder / LOG
        return {**report, "journal": journal, "log": str(log_path) if log_path.exists() else None}

    def start(self, version: str, force: bool, verified: str | None) -> tuple[bool, dict]:
        """Start installing ``version`` unless it runs already or the verified driver
        (``verified``) is that version; (started, view). Worker, one at a time."""
        from ..driver.journal import Journal
        from ..driver.plan import check_version
        version = check_version(version)
        if self.host.mounted:
            raise InstallUnavailable(
                "the agent runs in a container, where it sees the host read-only: it cannot install the host's "
                "driver", hint="install hostagent on the host (its deb or rpm) for driver installs through the agent, "
                                "or run 'hostagent driver install' there")
        now = self.view()
        if now["state"] in RUNNING:
            if now["version"] == version:
                return False, now
            raise ConflictError(f"a driver install of {now['version']} runs", hint="wait for it to end "
                                "(GET /v1/driver/install says when), then ask again")
        journal = Journal.load(self.host)
        if journal is not None and journal.alive:
            raise ConflictError(f"another driver operation is running: {journal.describe()}",
                                hint="wait for it to finish")
        if journal is None and verified == version:
            return False, now
        self._launch(version, force)
        return True, self.view()

    # ---- the installer's process ---------------------------------------------------------

    def command(self, version: str, force: bool) -> list[str]:
        argv = [sys.executable, "-m", "hostagent.cli.main"]
        if self.host.simulated:
            argv += ["--simulate", str(self.host.root)]
        argv += ["driver", "install", "--version", version, "--report", str(self.folder / REPORT), "-o", "json"]
        argv += [f"--ignore={c}" for c in self.agent.driver.settings.ignore]
        return argv + (["--force"] if force else [])

    def _launch(self, version: str, force: bool) -> None:
        """The report says ``starting`` first: the installer's own record replaces it."""
        from ..driver.report import Report
        ensure_dir(self.folder, 0o700)
        argv = self.command(version, force)
        Report.starting(self.folder / REPORT, version)
        run = processes.systemd_run(self.host)
        if run is not None:
            unit = f"hostagent-driver-install-{os.urandom(3).hex()}"
            done = subprocess.run([run, "--quiet", "--collect", f"--unit={unit}", "--service-type=exec",
                                   f"--description=hostagent: driver install {version}", "--", *argv],
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if done.returncode:
                why = f"systemd-run did not start it: {done.stderr.strip() or f'exit status {done.returncode}'}"
                Report(self.folder / REPORT, version).failed(why)
                raise StateError(f"the driver install of {version} did not start: {why}")
            log.info("driver install of %s started in %s.service", version, unit)
            return
        fd = os.open(self.folder / LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd="/",
                                    start_new_session=True)
        except OSError as e:
            Report(self.folder / REPORT, version).failed(f"the installer did not start: {e}")
            raise StateError(f"the driver install of {version} did not start: {e}") from None
        finally:
            os.close(fd)
        # Reaped while this agent lives (after it, by whoever adopts it), so that it is never
        # a zombie that looks alive.
        threading.Thread(target=proc.wait, name="driver-install-reaper", daemon=True).start()
        log.info("driver install of %s started (pid %d, its output in %s)", version, proc.pid, self.folder / LOG)
