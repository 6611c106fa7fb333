"""The real daemon as a test fixture: a simulated node in a directory others can traverse
(so tests can talk to it as another uid), ``hostagent --simulate DIR serve`` as a child
process, and a client on its socket."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hostagent.client import Client, DaemonNotRunning
from hostagent.errors import UnavailableError
from hostagent.sim.driverroot import create_node
from hostagent.sim.platform import simulated_host

__all__ = ["make_root", "AgentProcess", "running_agent", "ABSENT_GROUP", "existing_group"]

FAST = {"api": {"watch_heartbeat": 2}, "daemon": {"resync_interval": 0}}


def _absent_group() -> str:
    """The daemon's default group, 'hostagent', unless this machine has one: then a name no
    group has. The tests never depend on which groups exist."""
    import grp
    for name in ("hostagent", *(f"hostagent-test-{i}" for i in range(100))):
        try:
            grp.getgrnam(name)
        except KeyError:
            return name
    raise AssertionError("no free group name")


ABSENT_GROUP = _absent_group()


def existing_group() -> tuple[str, int]:
    """(name, gid) of a group this machine has that is not root's: the one of gid 65534
    (nogroup, nobody) where it exists, else any other."""
    import grp
    groups = sorted(grp.getgrall(), key=lambda g: (g.gr_gid != 65534, g.gr_gid))
    for g in groups:
        if g.gr_gid != 0:
            return g.gr_name, g.gr_gid
    import pytest
    pytest.skip("this machine has no group besides root's", allow_module_level=True)


def make_root(profile: str = "dgx-a100") -> Path:
    root = Path(tempfile.mkdtemp(prefix="ha-"))
    root.chmod(0o755)
    create_node(root, profile)
    return root


class AgentProcess:
    def __init__(self, root: Path, config: dict | None = None, env: dict | None = None):
        self.root = Path(root)
        self.host = simulated_host(self.root)
        self.config = self.root / "etc/hostagent/config.yaml"
        self.write_config(FAST if config is None else config)
        self.env = env or {}
        self.args: list[str] = []          # more daemon flags (--log-level ...)
        # A command the daemon is started under, which ends by running it in its own place
        # (unshare ... exec: a mount of its own), so its pid is still the daemon's.
        self.prefix: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.log_path = self.root / "daemon.log"
        self.socket = self.host.host("/run/hostagent/hostagent.sock")

    def write_config(self, config: dict | str) -> None:
        self.config.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(config, dict):
            # Tests never take dcgm-exporter's well-known port: socket /metrics only, unless
            # a test asks for a port itself.
            config = {**config, "metrics": {"port": None, **config.get("metrics", {})}}
            # Nor a group the machine may have: the socket is root-only unless a test asks.
            config["api"] = {"group": ABSENT_GROUP, **config.get("api", {})}
        text = config if isinstance(config, str) else json.dumps(config)   # JSON is YAML
        self.config.write_text(text)

    def start(self, wait: bool = True, timeout: float = 20) -> "AgentProcess":
        """Start the daemon; with ``wait``, until it answers (a daemon that never does is
        killed before the error)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        for inherited in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
            if inherited not in self.env:
                env.pop(inherited, None)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "hostagent.cli.main", "--simulate", str(self.root), "serve",
             "--config", str(self.config), *self.args], stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL)
        log.close()
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.kill()
                raise
        return self

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with self.client(timeout=2) as c:
                    c.node()
                return
            except (DaemonNotRunning, UnavailableError):
                time.sleep(0.05)
        raise AssertionError(f"daemon not ready after {timeout}s:\n{self.log()}")

    def client(self, timeout: float = 10) -> Client:
        return Client(socket_path=self.socket, timeout=timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon ignored SIGTERM:\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        from .mpsprocs import stop_all     # MPS daemons outlive the agent: stop them too
        stop_all(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_agent(root: Path, config: dict | str | None = None, env: dict | None = None, *, start: bool = True):
    """The daemon on the node at ``root`` for the block (started unless ``start`` is false);
    stopped, with its MPS daemons, and the node removed afterwards, whatever happened."""
    agent = AgentProcess(root, config, env)
    try:
        if start:
            agent.start()
        yield agent
    finally:
        try:
            agent.stop()
        finally:
            agent.cleanup()
