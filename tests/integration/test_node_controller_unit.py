"""The node controller's systemd unit: systemd-analyze verify accepts it, it orders after
the agent, waits for its configuration file, keeps no capability and writes nothing; the
packages install, enable and start it as they do the DRA plugin's."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.programs import script

from .test_daemon_unit import directives

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd/hostagent-node-controller.service"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/hostagent", script("hostagent")))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=60)
    errors = [line for line in done.stderr.splitlines()
              if "hostagent.service" not in line and "network-online.target" not in line]
    assert not errors, done.stderr


def test_after_the_agent_configured_by_its_env_file_and_confined():
    d = directives(UNIT.read_text())
    assert d["After"] == ["hostagent.service network-online.target"]
    assert d["Type"] == ["notify"]
    assert d["ExecStart"] == ["/usr/local/bin/hostagent node-controller $NODE_CONTROLLER_ARGS"]
    assert d["ConditionPathExists"] == ["/etc/hostagent/node-controller.env"]
    assert d["EnvironmentFile"] == ["/etc/hostagent/node-controller.env"]
    assert d["CapabilityBoundingSet"] == [""] and d["ProtectSystem"] == ["strict"]
    assert "ReadWritePaths" not in d and d["Restart"] == ["always"]


def test_the_packages_install_it_and_the_rpm_enables_starts_and_restarts_it_as_the_dra_plugins(tmp_path):
    spec = (REPO / "packaging/rpm/hostagent.spec").read_text()
    for line in spec.splitlines():
        if "hostagent-dra-plugin.service" in line:
            assert "hostagent-node-controller.service" in line, line
    # Both packages are made of what packaging/stage.py lays out: the unit, run from /usr/bin.
    loader = importlib.util.spec_from_file_location("stage", REPO / "packaging/stage.py")
    stage = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(stage)
    stage.host_files(REPO, tmp_path)
    staged = directives((tmp_path / "lib/systemd/system" / UNIT.name).read_text())
    assert staged["ExecStart"] == ["/usr/bin/hostagent node-controller $NODE_CONTROLLER_ARGS"]
