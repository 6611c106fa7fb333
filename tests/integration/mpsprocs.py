"""MPS daemons are real processes in the tests: find what a simulated node still runs, and
stop it, so that no test leaves one behind (or a shared /dev/shm mounted).

The tests look at processes from outside, as the agent must not: by their executable,
arguments and environment (``on_pipe``). That is an oracle for what runs, of any user, to
compare with what the agent recorded."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from hostagent.sharing import mps
from hostagent.sim.platform import simulated_host

__all__ = ["running", "stop_all", "alive", "daemon_pid", "on_pipe"]


def alive(pid: int) -> bool:
    """A process that runs (a zombie does not)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def on_pipe(host, name: str) -> list[int]:
    """Pids of the processes of any user running the node's control binary with ``-d`` and
    the pipe directory of daemon ``name`` (a device's UUID, an allocation daemon's key) in
    their environment."""
    from hostagent.processes import program
    prog = program(mps.control_tool(host))
    want = f"CUDA_MPS_PIPE_DIRECTORY={mps.pipe_dir(host, name)}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/exe")
            argv = [a for a in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0") if a]
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{st.st_dev}:{st.st_ino}" != prog.exe or argv[-1:] != [b"-d"] or want not in env:
            continue
        if prog.script is not None and prog.script.encode() not in argv[1:]:
            continue
        if alive(int(entry)):
            out.append(int(entry))
    return out


def daemon_pid(host, uuid: str) -> int | None:
    """The pid of the device's control daemon that root runs on its pipe directory (seen from
    outside: ``on_pipe``); None when none runs."""
    found = [p for p in on_pipe(host, uuid) if os.stat(f"/proc/{p}").st_uid == 0]
    assert len(found) <= 1, found
    return found[0] if found else None


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
