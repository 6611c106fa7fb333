"""packaging/build.py names what a build lacks by the Debian packages that provide it."""

import subprocess
import sys
from pathlib import Path

BUILD = Path(__file__).resolve().parents[2] / "packaging" / "build.py"


def test_missing_build_tools_are_named_with_their_packages(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run([sys.executable, str(BUILD), "deb", "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, env={"PATH": str(empty)})
    assert done.returncode == 1 and done.stderr == (
        "build.py: not installed: dpkg-buildpackage, dh, dpkg-checkbuilddeps (on Debian: apt-get install dpkg-dev "
        "debhelper)\n")
    assert not (tmp_path / "out").exists()


def dpkg_database_without(tmp_path, package: str) -> Path:
    """A copy of this machine's dpkg database (its status file) without ``package``."""
    import re
    paragraphs = Path("/var/lib/dpkg/status").read_text().split("\n\n")
    admindir = tmp_path / "dpkg"
    admindir.mkdir(parents=True)
    (admindir / "status").write_text("\n\n".join(
        p for p in paragraphs if not re.match(rf"Package: {re.escape(package)}\n", p)))
    return admindir


def test_a_missing_build_dependency_is_named_in_one_line_before_anything_is_built(tmp_path):
    """build-essential (which dpkg-buildpackage requires of every build) and the
    Build-Depends of packaging/deb/control are checked first, as dpkg-checkbuilddeps does."""
    import os
    import shutil
    import pytest
    if not all(shutil.which(t) for t in ("dpkg-buildpackage", "dh", "dpkg-checkbuilddeps")):
        pytest.skip("not installed: dpkg-dev, debhelper (.ci/run installs them)")
    for package in ("build-essential", "python3-setuptools"):
        env = {**os.environ, "DPKG_ADMINDIR": str(dpkg_database_without(tmp_path / package, package))}
        done = subprocess.run([sys.executable, str(BUILD), "deb", "--output", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 1 and done.stderr == (
            f"build.py: the deb's build dependencies are not installed: {package} "
            f"(on Debian: apt-get install {package})\n"), done.stderr
        assert not (tmp_path / "out").exists()
