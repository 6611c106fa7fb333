"""Session fixtures for the package tests: the deb and the Debian root, each made once.

Imported by tests/e2e/conftest.py so every e2e module can ask for them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .. import debian_root

BUILD = Path(__file__).resolve().parents[2] / "packaging" / "build.py"


def build(kind: str, out: Path, *args: str, output: bool = True) -> subprocess.CompletedProcess:
    """``build.py KIND`` with its scratch folder in ``out``, and its output too (for an
    image: the saved archive, which the image tests do not need)."""
    where = ["--output", str(out)] if output else []
    done = subprocess.run([sys.executable, str(BUILD), kind, *where, "--work", str(out / "work"), *args],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"build.py {kind} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


@pytest.fixture(scope="session")
def deb_package(tmp_path_factory) -> Path:
    """hostagent_<version>-1_<arch>.deb, built from this checkout with dpkg-buildpackage."""
    missing = [t for t in ("dpkg-buildpackage", "dh", "/usr/bin/python3") if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/run installs debhelper)")
    out = tmp_path_factory.mktemp("deb")
    build("deb", out)
    return next(out.glob("hostagent_*.deb"))


@pytest.fixture(scope="session")
def debian_tarball() -> Path:
    """A clean Debian 12 root with systemd (cached across sessions)."""
    return debian_root.root_tarball()


@pytest.fixture(scope="session")
def debian_image(debian_tarball) -> str:
    return debian_root.podman_image(debian_tarball)
