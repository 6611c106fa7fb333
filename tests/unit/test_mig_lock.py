"""What the MIG manager needs of the shared helpers: a re-entrant node lock (a CDI refresh
inside an apply) and writes that skip fsync for simulated state."""

import os
import subprocess
import sys
import threading

import pytest

from hostagent.errors import StateError
from hostagent.fileio import write_atomic
from hostagent.hostroot import HostRoot
from hostagent.lock import node_lock

PROBE = ("import sys; from hostagent.lock import node_lock; from hostagent.hostroot import HostRoot\n"
         "from hostagent.errors import StateError\n"
         "try:\n    with node_lock(HostRoot(root=sys.argv[1]), 'probe', timeout=0.1): print('free')\n"
         "except StateError: print('held')")


def probe(root) -> str:
    return subprocess.run([sys.executable, "-c", PROBE, str(root)], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_node_lock_is_reentrant_in_one_thread_and_held_until_the_outer_release(tmp_path):
    host = HostRoot(root=tmp_path)
    with node_lock(host, "mig apply", timeout=0.2):
        with node_lock(host, "cdi refresh", timeout=0.2):     # would deadlock on its own flock
            assert probe(tmp_path) == "held"
        assert probe(tmp_path) == "held"                      # the inner release keeps it
    assert probe(tmp_path) == "free"


def test_node_lock_still_excludes_other_threads(tmp_path):
    host = HostRoot(root=tmp_path)
    seen = []

    def other():
        try:
            with node_lock(host, "other thread", timeout=0.2):
                seen.append("got it")
        except StateError:
            seen.append("refused")

    with node_lock(host, "mig apply"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == ["refused"]


def test_write_atomic_without_durability_is_still_atomic(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    target.write_text("old")

    def no_fsync(*a):
        raise AssertionError("durable=False must not fsync")
    monkeypatch.setattr(os, "fsync", no_fsync)
    write_atomic(target, "new", mode=0o600, durable=False)
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]
    with pytest.raises(AssertionError):
        write_atomic(target, "durable")       # the default still syncs
