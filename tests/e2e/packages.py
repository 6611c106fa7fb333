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
def staged_tree(tmp_path_factory) -> Path:
    """The installed tree (build.py stage), made once: the deb and the rpm are built from it."""
    python = f"/usr/bin/python3.{sys.version_info.minor}"
    if not Path(python).exists():
        pytest.skip(f"the packages are built for the distribution's {python}, which is missing")
    out = tmp_path_factory.mktemp("stage")
    done = subprocess.run([sys.executable, str(BUILD), "stage", "--dest", str(out / "tree"), "--work",
                           str(out / "work")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"build.py stage failed:\n{done.stderr[-6000:]}"
    return out / "tree"


@pytest.fixture(scope="session")
def deb_package(tmp_path_factory, staged_tree) -> Path:
    """hostagent_<version>-1_<arch>.deb, built from this checkout with dpkg-buildpackage."""
    missing = [t for t in ("dpkg-buildpackage", "dh") if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/run installs debhelper)")
    out = tmp_path_factory.mktemp("deb")
    build("deb", out, "--stage", str(staged_tree))
    return next(out.glob("hostagent_*.deb"))


@pytest.fixture(scope="session")
def rpm_package(tmp_path_factory, staged_tree) -> Path:
    """hostagent-<version>-1.<arch>.rpm, built with rpmbuild from the same tree as the deb."""
    if not shutil.which("rpmbuild"):
        pytest.skip("rpmbuild is not installed (.ci/run installs Debian's rpm package)")
    out = tmp_path_factory.mktemp("rpm")
    build("rpm", out, "--stage", str(staged_tree))
    return next(out.glob("hostagent-*.rpm"))


@pytest.fixture(scope="session")
def debian_tarball() -> Path:
    """A clean Debian 12 root with systemd (cached across sessions)."""
    return debian_root.root_tarball(debian_root.BASE_PACKAGES)


@pytest.fixture(scope="session")
def debian_image(debian_tarball) -> str:
    return debian_root.podman_image(debian_tarball)
