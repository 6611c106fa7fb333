"""The suite and CI run as a new user would: the README's test command is what .ci/run runs,
and no test or benchmark starts a program by bare name or leaves the interpreter's venv."""

import re
from pathlib import Path

from tests.programs import PROGRAMS

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("tests", "bench") for p in (REPO / d).rglob("*.py") if p != Path(__file__))
# An argv that starts with a bare interpreter or one of our programs, found through PATH
# (absent from a venv that is not activated, or another installation's).
BARE = re.compile(r"""[(=]\s*\[\s*["'](python3?|%s)["']\s*[,\]]""" % "|".join(map(re.escape, PROGRAMS)))
LOOKUP = re.compile(r"""which\(\s*["'](python3?|%s)["']""" % "|".join(map(re.escape, PROGRAMS)))


def readme_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_ci_runs_the_readme_test_command_in_a_new_venv():
    ci = (REPO / ".ci/run").read_text()
    command = next(b.strip() for b in readme_blocks() if "pytest" in b)
    assert command in ci.splitlines(), f".ci/run does not run the README's test command {command!r}"
    assert "python3 -m venv" in command and "pip install '.[test]'" in command
    assert ci.index("rm -rf .venv") < ci.index(command)


def test_programs_are_started_from_this_interpreter():
    found = []
    for path in SOURCES:
        text = path.read_text()
        for pattern, what in ((BARE, "started by bare name"), (LOOKUP, "looked up on PATH")):
            found += [f"{path.relative_to(REPO)}: {m.group(1)!r} {what}" for m in pattern.finditer(text)]
        if "realpath(sys.executable)" in text:
            found.append(f"{path.relative_to(REPO)}: realpath(sys.executable) leaves a venv (its python is a symlink)")
    assert not found, "use sys.executable, or tests.programs.script() for installed programs:\n" + "\n".join(found)
