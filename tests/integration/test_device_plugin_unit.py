"""The device plugin's systemd unit: systemd-analyze verify accepts it, it orders after the
agent, keeps no capability and may write only in the kubelet's directories; and the plugin
speaks the notify protocol its Type=notify needs (READY=1, STATUS= as things change,
STOPPING=1)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.programs import script

from .agentd import AgentProcess, make_root
from .test_daemon_unit import directives

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd/hostagent-device-plugin.service"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    program = script("hostagent")
    unit = tmp_path / "hostagent-device-plugin.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/hostagent", program))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=60)
    # verify also checks the units named in After=/Wants=; the agent's is not installed here.
    errors = [line for line in done.stderr.splitlines() if "hostagent.service" not in line]
    assert not errors, done.stderr


def test_after_the_agent_notify_and_confined():
    d = directives(UNIT.read_text())
    assert d["After"] == ["hostagent.service"] and d["Wants"] == ["hostagent.service"]
    assert d["Type"] == ["notify"] and d["ExecStart"] == ["/usr/local/bin/hostagent device-plugin"]
    assert d["CapabilityBoundingSet"] == [""] and d["ProtectSystem"] == ["strict"]
    assert d["ReadWritePaths"] == ["-/var/lib/kubelet/device-plugins -/var/lib/kubelet/pod-resources"]
    assert d["Restart"] == ["always"]


def test_ready_then_status_over_the_notify_socket():
    root = make_root()
    agent = AgentProcess(root)
    work = Path(tempfile.mkdtemp(prefix="dpn-"))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify"))
    notify.settimeout(20)
    plugin = None
    try:
        agent.start()
        env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_USEC", "WATCHDOG_PID")}
        env["NOTIFY_SOCKET"] = str(work / "notify")
        plugin = subprocess.Popen([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root),
                                   "device-plugin", "--plugin-dir", str(work / "dp"),
                                   "--pod-resources-socket", "none"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        messages = [notify.recv(4096).decode()]
        assert "READY=1" in messages[0]
        while "agent connected; resources: nvidia.com/gpu (8, not registered)" not in messages[-1]:
            messages.append(notify.recv(4096).decode())
        assert (work / "dp/hostagent-gpu.sock").exists()
        plugin.terminate()
        assert plugin.wait(15) == 0
        while "STOPPING=1" not in messages[-1]:
            messages.append(notify.recv(4096).decode())
        assert not (work / "dp/hostagent-gpu.sock").exists()
    finally:
        if plugin is not None and plugin.poll() is None:
            plugin.kill()
        notify.close()
        agent.stop()
        agent.cleanup()
        shutil.rmtree(work, ignore_errors=True)
