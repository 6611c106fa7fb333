"""The systemd unit: systemd-analyze verify accepts it; ordering, notify and hardening as
documented, every kept capability explained in docs/daemon.md."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.programs import script

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd/hostagent.service"


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart exists: point it at this installation's hostagentd.
    daemon = script("hostagentd")
    unit = tmp_path / "hostagent.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/hostagentd", daemon))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_order_notify_and_hardening():
    d = directives(UNIT.read_text())
    before = " ".join(d["Before"]).split()
    assert {"containerd.service", "crio.service", "docker.service", "kubelet.service"} <= set(before)
    # The shell's builtin kill: a minimal Debian has no /bin/kill (the deb's install test reloads).
    assert d["Type"] == ["notify"] and d["WatchdogSec"] and d["ExecReload"] == ["""/bin/sh -c 'kill -HUP "$MAINPID"'"""]
    assert d["ExecStart"] == ["/usr/local/bin/hostagentd"]     # where pip puts it
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelModules", "RestrictSUIDSGID"):
        assert d[key] == ["yes"], key
    assert d["ProtectSystem"] == ["strict"] and d["DevicePolicy"] == ["closed"]


def test_every_kept_capability_is_documented():
    caps = directives(UNIT.read_text())["CapabilityBoundingSet"][0].split()
    docs = (REPO / "docs/daemon.md").read_text()
    for cap in caps:
        assert re.search(rf"`{cap}`", docs), f"{cap} is kept but docs/daemon.md does not say why"


def test_the_labels_directory_is_writable_in_the_sandbox():
    """ProtectSystem=strict makes /etc read-only: the NFD features directory is opened up
    (and made before the sandbox, when missing)."""
    import os
    from hostagent.labels import FEATURES_FILE
    d = directives(UNIT.read_text())
    directory = os.path.dirname(FEATURES_FILE)
    assert f"-{directory}" in d["ReadWritePaths"]
    assert f"+/bin/mkdir -p {directory}" in d["ExecStartPre"]


def test_device_groups_are_the_drivers_and_documented(tmp_path):
    """DeviceAllow=char-<group> names groups of /proc/devices (systemd skips names no driver
    registered, silently): the simulated driver's groups are all allowed, and every allowed
    group is one of the NVIDIA driver's, documented in docs/daemon.md."""
    from hostagent.sim.driverroot import create_node
    drivers = {"nvidia-frontend", "nvidia", "nvidia-uvm", "nvidia-caps", "nvidia-caps-imex-channels",
               "nvidia-nvswitch", "nvidia-nvlink"}
    allowed = {v.split()[0].removeprefix("char-") for v in directives(UNIT.read_text())["DeviceAllow"]}
    assert allowed <= drivers, allowed - drivers
    create_node(tmp_path, "dgx-a100")
    lines = (tmp_path / "proc/devices").read_text().split("Block devices:")[0].splitlines()[1:]
    simulated = {line.split()[1] for line in lines if line.strip()} & drivers
    assert simulated and simulated <= allowed, simulated - allowed
    docs = (REPO / "docs/daemon.md").read_text()
    for group in allowed:
        assert f"`{group}`" in docs, f"DeviceAllow=char-{group} is not explained in docs/daemon.md"
