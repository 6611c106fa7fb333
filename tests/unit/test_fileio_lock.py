"""Atomic writes and the node lock."""

import os
import subprocess
import sys

import pytest

from hostagent.errors import StateError
from hostagent.fileio import write_atomic
from hostagent.hostroot import HostRoot
from hostagent.lock import node_lock


def test_write_atomic_replaces_whole_files_with_explicit_mode(tmp_path):
    target = tmp_path / "spec.json"
    target.write_text("old")
    old = os.umask(0o077)
    try:
        write_atomic(target, "new", mode=0o644)
    finally:
        os.umask(old)
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o644
    assert os.listdir(tmp_path) == ["spec.json"]


def test_write_atomic_failure_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "config.toml"
    target.write_text("old")

    def boom(*a):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_atomic(target, "new")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["config.toml"]


def test_node_lock_excludes_other_processes_and_names_the_holder(tmp_path):
    host = HostRoot(root=tmp_path)
    code = ("import sys, time; from hostagent.lock import node_lock; from hostagent.hostroot import HostRoot\n"
            "with node_lock(HostRoot(root=sys.argv[1]), 'mig apply'):\n"
            "    print('locked', flush=True); time.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateError, match=f"pid {holder.pid}: mig apply"):
            with node_lock(host, "cdi refresh", timeout=0.2):
                pass
    finally:
        holder.kill()
        holder.wait()
    with node_lock(host, "cdi refresh", timeout=2):   # released when the holder died
        pass
