"""The programs this checkout installs (``[project.scripts]`` of pyproject.toml), found where
pip put them for the running interpreter, never through PATH: the tests pass whether or not
a venv is activated."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

__all__ = ["PROGRAMS", "require", "installed", "script"]

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = tuple(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def script(name: str) -> str:
    """The installed program ``name``, as an absolute path in this interpreter's scripts folder."""
    folder = Path(sysconfig.get_path("scripts"))
    path = folder / name
    assert path.is_file(), (f"{name} is not installed in {folder} (the scripts folder of {sys.executable}): "
                            "run pip install . (or -e .) with this interpreter again")
    return str(path)


def installed(*tools: str) -> str:
    """The first of ``tools`` on PATH; a skip saying what is missing when none is (.ci/run
    installs every tool a test needs)."""
    found = next((shutil.which(t) for t in tools if shutil.which(t)), None)
    if found is None:
        import pytest
        pytest.skip(f"not installed: {' or '.join(tools)} (.ci/run installs it)")
    return found


def require(*tools: str, root_for: str) -> None:
    """Skip, saying why, unless this runs as root (``root_for`` says what needs it) and every
    one of ``tools`` is on PATH."""
    import pytest
    if os.geteuid() != 0:
        pytest.skip(f"{root_for} need root here")
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/run installs them)")
