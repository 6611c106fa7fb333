"""The RPM, built with rpmbuild from the same installed tree as the deb, with the same
scriptlets, and clean for rpmlint (with the filters packaging/rpm/hostagent.rpmlintrc
explains)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from hostagent import __version__

SRC = Path(__file__).resolve().parents[2]


def rpm_query(rpm: Path, *args: str) -> str:
    return subprocess.run(["rpm", "-qp", *args, str(rpm)], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def rpm(rpm_package) -> Path:
    """Built once a session, from the installed tree the deb is made of."""
    return rpm_package


def test_rpm_is_named_and_versioned_from_the_package_version(rpm):
    assert rpm.name.startswith(f"hostagent-{__version__}-1.")
    assert rpm_query(rpm, "--queryformat", "%{VERSION}").strip() == __version__


def test_rpm_installs_the_programs_units_config_and_docs(rpm):
    files = set(rpm_query(rpm, "-l").split())
    with open(SRC / "pyproject.toml", "rb") as f:
        programs = tomllib.load(f)["project"]["scripts"]
    for name in programs:
        assert f"/usr/bin/{name}" in files and f"/opt/hostagent/bin/{name}" in files
    units = {p.name for p in (SRC / "systemd").iterdir() if p.suffix == ".service"}
    assert units <= {Path(f).name for f in files if f.startswith("/usr/lib/systemd/system/")}
    assert "/usr/lib/systemd/system-preset/90-hostagent.preset" in files
    assert {"/usr/share/containers/oci/hooks.d/50-hostagent.json", "/usr/share/man/man1/hostagent.1.gz",
            "/usr/share/bash-completion/completions/hostagent", "/usr/share/doc/hostagent/daemon.md",
            "/usr/share/doc/hostagent/hostagent-dashboard.json"} <= files
    assert rpm_query(rpm, "-c").split() == ["/etc/hostagent/config.yaml"]
    # The bundled libraries need nothing from the system but the interpreter.
    requires = rpm_query(rpm, "-R")
    assert "/usr/bin/python3.11" in requires and "libyaml" not in requires and ".so" not in requires.replace(
        "rpmlib", "")


def test_rpm_scriptlets_are_the_debs(rpm):
    scripts = rpm_query(rpm, "--scripts")
    for snippet in ("add-group", "revert-runtimes", "purge"):
        body = (SRC / "packaging/common" / f"{snippet}.sh").read_text()
        assert body.strip().splitlines()[-1].strip() in scripts, snippet
    # Every unit as the deb's dh_installsystemd has it: enabled at install and disabled at
    # removal; the services (not the boot-time oneshot) started at install and restarted on
    # upgrade.
    units = sorted(p.name for p in (SRC / "systemd").iterdir() if p.suffix == ".service")
    boot = {u for u in units if "DefaultDependencies=no" in (SRC / "systemd" / u).read_text()}
    services = [u for u in units if u not in boot]
    assert boot == {"hostagent-mig.service"} and "hostagent-device-plugin.service" in services
    for unit in units:
        assert re.search(rf"systemctl --no-reload preset [^\n]*\b{unit}", scripts), unit
        assert re.search(rf"systemctl --no-reload disable --now [^\n]*\b{unit}", scripts), unit
    for unit in services:
        assert re.search(rf"systemctl start [^\n]*\b{unit}", scripts), unit
        assert re.search(rf"systemctl try-restart [^\n]*\b{unit}", scripts), unit


def test_rpmlint_finds_no_errors(rpm):
    if not shutil.which("rpmlint"):
        pytest.skip("rpmlint is not installed (.ci/run installs it)")
    done = subprocess.run(["rpmlint", "-r", str(SRC / "packaging/rpm/hostagent.rpmlintrc"), str(rpm)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and " 0 errors" in done.stdout, done.stdout
