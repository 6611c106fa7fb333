"""The DRA plugin's systemd unit: systemd-analyze verify accepts it, it orders after the
agent, waits for its configuration file, keeps no capability and may write only in the
kubelet's plugin folders; and the plugin speaks the notify protocol its Type=notify needs."""

import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.programs import script

from .dracluster import Cluster
from .test_daemon_unit import directives

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPO, "systemd/hostagent-dra-plugin.service")


def unit_text() -> str:
    with open(UNIT) as f:
        return f.read()


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    program = script("hostagent")
    unit = tmp_path / "hostagent-dra-plugin.service"
    unit.write_text(unit_text().replace("/usr/local/bin/hostagent", program))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=60)
    # verify also checks the units named in After=/Wants=; the agent's is not installed here.
    errors = [line for line in done.stderr.splitlines()
              if "hostagent.service" not in line and "network-online.target" not in line]
    assert not errors, done.stderr


def test_after_the_agent_configured_by_its_env_file_and_confined():
    d = directives(unit_text())
    assert d["After"] == ["hostagent.service network-online.target"]
    assert d["Type"] == ["notify"] and d["ExecStart"] == ["/usr/local/bin/hostagent dra-plugin $DRA_PLUGIN_ARGS"]
    assert d["ConditionPathExists"] == ["/etc/hostagent/dra-plugin.env"]
    assert d["EnvironmentFile"] == ["/etc/hostagent/dra-plugin.env"]
    assert d["CapabilityBoundingSet"] == [""] and d["ProtectSystem"] == ["strict"]
    assert d["ReadWritePaths"] == ["-/var/lib/kubelet/plugins_registry -/var/lib/kubelet/plugins"]
    assert d["Restart"] == ["always"]


def test_ready_then_status_over_the_notify_socket():
    cluster = Cluster()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(cluster.work / "notify"))
    notify.settimeout(20)
    plugin = None
    try:
        cluster.api.start()
        cluster.api.add_node("node-1")
        kubeconfig = cluster.api.kubeconfig(cluster.work / "kubeconfig")
        cluster.agent.start()
        cluster.kubelet.start()
        env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_USEC", "WATCHDOG_PID")}
        env.update(NOTIFY_SOCKET=str(cluster.work / "notify"), NODE_NAME="node-1", KUBECONFIG=str(kubeconfig))
        plugin = subprocess.Popen([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(cluster.root),
                                   "dra-plugin", "--plugin-registry", str(cluster.kubelet.registry),
                                   "--plugin-dir", str(cluster.work / "plugin")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        messages = [notify.recv(4096).decode()]
        assert "READY=1" in messages[0]
        while "agent connected; 8 device(s); registered; pool generation 1" not in messages[-1]:
            messages.append(notify.recv(4096).decode())
        plugin.terminate()
        assert plugin.wait(15) == 0
        while "STOPPING=1" not in messages[-1]:
            messages.append(notify.recv(4096).decode())
        assert not (cluster.work / "plugin/dra.sock").exists()
    finally:
        if plugin is not None and plugin.poll() is None:
            plugin.kill()
        notify.close()
        cluster.close()
