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
        "build.py: not installed: dpkg-buildpackage, dh (on Debian: apt-get install dpkg-dev debhelper)\n")
    assert not (tmp_path / "out").exists()
