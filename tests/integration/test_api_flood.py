"""Members of the agent's group flood the API socket with connections, keeping its accept
queue full: root (its requests, the liveness probe) is served all the same, through its own
socket."""

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest

from hostagent import client

from ..waiting import until
from .agentd import FAST, existing_group, make_root, running_agent

pytestmark = pytest.mark.root("starts flooding processes as another user")

NOBODY = 65534
API_GROUP, API_GID = existing_group()
FLOODERS = 4
FLOOD_LIMIT = 600            # seconds: a flooder outliving its test (and parent) stops by itself


def flooder(path: str) -> int:
    """A child, as a group member, that connects and hangs up until killed; returns its pid.
    Its connects block while the queue is full and the kernel wakes them the moment the
    daemon accepts one, so the freed places are taken again before anyone polling can."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(API_GID)
            os.setuid(NOBODY)
            end = time.monotonic() + FLOOD_LIMIT
            while os.getppid() == parent and time.monotonic() < end:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(None)
                try:
                    s.connect(path)
                except OSError:
                    time.sleep(0.01)
                s.close()
        finally:
            os._exit(0)
    return pid


def queue_full(path) -> bool:
    """Whether a connection to ``path`` now would find its accept queue full."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
        return False
    except BlockingIOError:
        return True
    finally:
        probe.close()


def test_root_and_the_probe_are_served_while_members_flood_the_socket(monkeypatch):
    # Root's requests must never meet the flooded queue: a client that did would wait for
    # room longer than its request may take, and fail.
    monkeypatch.setattr(client, "CONNECT_RETRY", 6.0)
    config = {**FAST, "api": {**FAST["api"], "group": API_GROUP}}
    with running_agent(make_root(), config) as agent:
        admin = agent.socket.parent / "admin.sock"
        pids = []
        try:
            pids = [flooder(str(agent.socket)) for _ in range(FLOODERS)]
            until(lambda: queue_full(agent.socket), timeout=30, what="full accept queue on the API socket")
            full = [0, 0]                   # probes that found the queue full: the API socket's, root's
            checks = []
            for i in range(40):
                for n, path in enumerate((agent.socket, admin)):
                    full[n] += queue_full(path)
                with agent.client(timeout=5) as c:
                    assert c.node()["gpus"] == 8
                if i % 4 == 0:
                    checks.append(subprocess.run(
                        [sys.executable, "-m", "hostagent.daemon.main", "--check", "--simulate", str(agent.root),
                         "--config", str(agent.config)], capture_output=True, text=True, timeout=30).returncode)
                time.sleep(0.05)
            flooding = [pid for pid in pids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ChildProcessError):
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
        assert flooding == pids, "a flooder stopped early: the test shows nothing"
        assert full[0] > 0, "the flood did not keep the API socket's queue full: the test shows nothing"
        assert full[1] == 0 and checks == [0] * 10, (full, checks)
