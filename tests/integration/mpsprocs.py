"""MPS daemons are real processes in the tests: find what a simulated node still runs, and
stop it, so that no test leaves one behind (or a shared /dev/shm mounted)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from hostagent.sharing import mps
from hostagent.sim.platform import simulated_host

__all__ = ["running", "stop_all", "alive", "daemon_pid"]


def alive(pid: int) -> bool:
    """A process that runs (a zombie does not)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def daemon_pid(host: HostRoot, uuid: str) -> int | None:
    """The pid of the device's control daemon, found as the agent finds it (its binary, its
    pipe directory in its environment); None when none runs."""
    found = mps.find(host, uuid)
    assert len(found) <= 1, found
    return found[0].pid if found else None


def running(root: Path) -> list[int]:
    """Pids of the simulated MPS control daemons and servers of the node in ``root``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(str(root).encode() in c and b"nvidia-cuda-mps" in c for c in cmd):
            out.append(int(entry))
    return out


def stop_all(root: Path) -> list[int]:
    """Stop every daemon of the node (as ``off`` would, then by signal) and unmount its
    shared /dev/shm; returns the pids that were still running before."""
    host = simulated_host(root)
    left = running(root)
    for uuid in mps.find_daemons(host):
        mps.stop(host, uuid, timeout=2.0)
    for pid in running(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while running(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    if os.path.ismount(mps.shm_dir(host)):
        mps.unmount_shm(host)
    return left
