"""The boot-time MIG unit: valid for systemd, ordered before the GPU's users, bounded."""

import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "hostagent-mig.service"


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    # Verify inside a root that has the packaged binary path, so ExecStart is checked too.
    (tmp_path / "usr/bin").mkdir(parents=True)
    stub = tmp_path / "usr/bin/hostagent"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    shutil.copy(UNIT, units)
    done = subprocess.run(["systemd-analyze", "verify", f"--root={tmp_path}", "--man=no",
                           str(units / UNIT.name)], capture_output=True, text=True)
    # verify exits 0 on some problems and only warns: any output is a problem.
    assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr.strip() == "", done.stderr


def test_unit_runs_before_runtimes_and_kubelet_with_a_start_timeout():
    d = directives(UNIT.read_text())
    before = " ".join(d["Before"]).split()
    for unit in ("kubelet.service", "containerd.service", "crio.service", "docker.service", "hostagent.service"):
        assert unit in before
    assert d["Type"] == ["oneshot"] and d["DefaultDependencies"] == ["no"]
    assert 0 < int(d["TimeoutStartSec"][0]) <= 600
    assert "Requires" not in d and "BindsTo" not in d     # a failed apply never blocks boot
    assert d["ExecStart"] == ["/usr/bin/hostagent mig apply --if-driver-loaded"]
    assert d["ConditionPathExists"] == ["/etc/hostagent/mig.env"]
