"""A member of the agent's group floods the API socket with connections it opens and closes
at once, filling its accept queue: root (its requests, the liveness probe) is served all the
same, through its own socket."""

import os
import socket
import subprocess
import sys
import time

import pytest

from .agentd import FAST, AgentProcess, existing_group, make_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a flooding process as another user")

NOBODY = 65534
API_GROUP, API_GID = existing_group()
FLOOD_SECONDS = 10


def flood(path: str, seconds: float) -> int:
    """In a child as a group member: connect and close as fast as it can; returns the pid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(API_GID)
            os.setuid(NOBODY)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(path)
                except OSError:
                    pass
                s.close()
        finally:
            os._exit(0)
    return pid


def test_root_and_the_probe_are_served_while_a_member_floods_the_socket():
    agent = AgentProcess(make_root(), {**FAST, "api": {**FAST["api"], "group": API_GROUP}}).start()
    flooder = None
    try:
        flooder = flood(str(agent.socket), FLOOD_SECONDS)
        time.sleep(0.5)                         # the queue is full by now
        refused = [0, 0]
        for n, path in enumerate((agent.socket, agent.socket.parent / "admin.sock")):
            for _ in range(50):                 # the API socket's queue is full, root's is not
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                probe.setblocking(False)
                try:
                    probe.connect(str(path))
                except BlockingIOError:
                    refused[n] += 1
                finally:
                    probe.close()
        ok, checks = 0, []
        for i in range(40):
            try:
                with agent.client(timeout=5) as c:
                    ok += c.node()["gpus"] == 8
            except Exception:
                pass
            if i % 4 == 0:
                checks.append(subprocess.run(
                    [sys.executable, "-m", "hostagent.daemon.main", "--check", "--simulate", str(agent.root),
                     "--config", str(agent.config)], capture_output=True, text=True, timeout=30).returncode)
            time.sleep(0.1)
        _, status = os.waitpid(flooder, 0)
        flooder = None
        assert refused[0] > 0, "the flood did not fill the API socket's queue: the test shows nothing"
        assert refused[1] == 0
        assert ok >= 39 and checks == [0] * 10, (ok, checks)
    finally:
        if flooder is not None:
            os.kill(flooder, 9)
            os.waitpid(flooder, 0)
        agent.stop()
        agent.cleanup()
