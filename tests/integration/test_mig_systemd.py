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


# docs/mig.md's drop-in for a hostagent installed elsewhere than pip's /usr/local/bin.
DROP_IN = ("[Service]\nExecStart=\n"
           "ExecStart=/opt/hostagent/venv/bin/hostagent mig apply --if-driver-loaded\n")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("binary, drop_in", [("usr/local/bin/hostagent", None),
                                             ("opt/hostagent/venv/bin/hostagent", DROP_IN)])
def test_unit_passes_systemd_analyze_verify(tmp_path, binary, drop_in):
    # Verify inside a root that has the binary where ExecStart names it, so it is checked too.
    stub = tmp_path / binary
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    shutil.copy(UNIT, units)
    if drop_in:
        (units / f"{UNIT.name}.d").mkdir()
        (units / f"{UNIT.name}.d/override.conf").write_text(drop_in)

    def verify():
        return subprocess.run(["systemd-analyze", "verify", f"--root={tmp_path}", "--man=no",
                               str(units / UNIT.name)], capture_output=True, text=True)
    done = verify()
    # verify exits 0 on some problems and only warns: any output is a problem.
    assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr.strip() == "", done.stderr
    stub.unlink()                            # and it does check the binary ExecStart names
    assert verify().returncode != 0


def test_unit_runs_before_runtimes_and_kubelet_with_a_start_timeout():
    d = directives(UNIT.read_text())
    before = " ".join(d["Before"]).split()
    for unit in ("kubelet.service", "containerd.service", "crio.service", "docker.service", "hostagent.service"):
        assert unit in before
    assert d["Type"] == ["oneshot"] and d["DefaultDependencies"] == ["no"]
    assert 0 < int(d["TimeoutStartSec"][0]) <= 600
    assert "Requires" not in d and "BindsTo" not in d     # a failed apply never blocks boot
    assert d["ExecStart"] == ["/usr/local/bin/hostagent mig apply --if-driver-loaded"]   # where pip puts it
    assert d["ConditionPathExists"] == ["/etc/hostagent/mig.env"]
