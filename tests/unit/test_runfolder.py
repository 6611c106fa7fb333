"""A test run leaves nothing behind: what its tests started and made is stopped and removed
at its end, after a failure with -x and after an interruption too, and a run whose tests
left something says what."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from ..waiting import until

REPO = Path(__file__).resolve().parents[2]

# A test that starts a process and makes a folder, then passes, fails or waits to be interrupted.
LEAVER = textwrap.dedent("""
    import os, subprocess, sys, tempfile, time
    from pathlib import Path

    def test_leaves_a_process_and_a_folder():
        folder = tempfile.mkdtemp()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        Path(os.environ["LEAVER_REPORT"]).write_text(f"{child.pid} {folder}")
        assert os.environ["LEAVER_ENDS"] != "failing"
        if os.environ["LEAVER_ENDS"] == "interrupted":
            time.sleep(300)

    def test_not_run_after_a_failure_with_x():
        Path(os.environ["LEAVER_REPORT"] + ".second").touch()
""")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("workers", ["0", "2"], ids=["serial", "parallel"])
@pytest.mark.parametrize("ends", ["passing", "failing", "interrupted"])
def test_a_run_stops_and_removes_what_its_tests_left(tmp_path, ends, workers):
    (tmp_path / "test_leaver.py").write_text(LEAVER)
    report = tmp_path / "report"
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-c", str(REPO / "pyproject.toml"), "-n", workers, str(tmp_path / "test_leaver.py")],
        cwd=REPO, env={**os.environ, "LEAVER_REPORT": str(report), "LEAVER_ENDS": ends},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if ends == "interrupted":
            until(report.exists, timeout=60, what="the inner test's start")
            inner.send_signal(signal.SIGTERM)
        out, _ = inner.communicate(timeout=120)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
    pid, folder = report.read_text().split()
    run_folder = Path(folder).parents[1]
    assert run_folder.name.startswith("ha-tests-"), folder
    assert gone(int(pid)) and not run_folder.exists(), out
    # -x in a parallel run stops its workers, which pytest-xdist reports as an interruption (2).
    failed = 1 if workers == "0" else 2
    assert inner.returncode == {"passing": 1, "failing": failed, "interrupted": 2}[ends], out
    if ends == "passing":          # the test passed, the run fails: it left a process
        assert "the tests left these running or mounted (now stopped)" in out and f"process {pid}:" in out, out
    assert Path(f"{report}.second").exists() == (ends == "passing"), out
