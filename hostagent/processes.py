"""Processes the agent started or adopted, known by what the kernel says of them, never by a
pid someone wrote in a file.

A ``ProcessRecord`` is a pid with the process's start time and the identity (device and
inode) of its executable, taken from ``/proc`` when the agent found the process itself. A
signal goes to that process only: the record is checked again right before it (a pid that
was reused names a process with another start time), through a pidfd where the kernel has
them (``pidfd_open``, Linux 5.3), which pins the process, so the check and the signal
cannot name two different processes.

A record is made of a process the agent started (``record``), never of one found by what it
shows of itself: its executable, arguments and environment are whatever its starter chose,
and any local user can start a process that looks like one of the agent's. ``program``
says how a program's processes show their executable (to check that the process started
runs what was meant). The agent's own ``/proc`` is read: the processes it starts are in its
PID namespace.
"""

from __future__ import annotations

import os
import signal as signals
import time
from dataclasses import asdict, dataclass

__all__ = ["ProcessRecord", "Program", "program", "record", "current", "send", "wait_gone", "systemd_run"]


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    start: float            # when it started (seconds since the epoch, as the kernel counts)
    exe: str                # "<device>:<inode>" of its executable

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict | None) -> "ProcessRecord | None":
        if not raw:
            return None
        return cls(int(raw["pid"]), float(raw["start"]), str(raw["exe"]))


@dataclass(frozen=True)
class Program:
    """How a program shows in ``/proc``: the executable the kernel runs (``exe``) and, for a
    ``#!`` script, the script's path on the command line."""
    exe: str                 # "<device>:<inode>"
    script: str | None = None


def _exe_id(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def program(path: str) -> Program:
    """``path`` as its processes show: a binary is its own executable; a ``#!`` script runs
    its interpreter, with the script's path among the arguments. Raises OSError."""
    with open(path, "rb") as f:
        head = f.read(256)
    if head.startswith(b"#!"):
        interpreter = head[2:].split(b"\n", 1)[0].split()[0].decode()
        return Program(_exe_id(os.stat(interpreter)), os.fspath(path))
    return Program(_exe_id(os.stat(path)))


def _start(pid: int) -> float | None:
    import psutil
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except psutil.Error:
        return None


def _exe(pid: int) -> str | None:
    try:
        return _exe_id(os.stat(f"/proc/{pid}/exe"))
    except OSError:
        return None


def record(pid: int) -> ProcessRecord | None:
    """The record of the live process ``pid`` (None: gone, a zombie, or not ours to see)."""
    start, exe = _start(pid), _exe(pid)
    if start is None or exe is None:
        return None
    return ProcessRecord(pid, start, exe)


def current(rec: ProcessRecord | None) -> bool:
    """Is the process ``rec`` names still running (the same start time and executable)?"""
    if rec is None:
        return False
    now = record(rec.pid)
    return now is not None and now.exe == rec.exe and abs(now.start - rec.start) < 0.05


def send(rec: ProcessRecord, sig: int) -> bool:
    """Signal the process ``rec`` names, if it is still that process; False when it is not
    (gone, or its pid now another process's). With a pidfd the process is pinned between
    the check and the signal."""
    try:
        fd = os.pidfd_open(rec.pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):      # no pidfds: check, then signal at once
        if not current(rec):
            return False
        try:
            os.kill(rec.pid, sig)
        except ProcessLookupError:
            return False
        return True
    try:
        if not current(rec):
            return False
        try:
            signals.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            return False
        return True
    finally:
        os.close(fd)


def wait_gone(rec: ProcessRecord, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while current(rec):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def systemd_run(host) -> str | None:
    """``systemd-run``'s path when the agent is a systemd service on a real host (what it
    starts to outlive it, or to leave its sandbox, then runs in a transient unit); None else."""
    if host.simulated or not os.environ.get("INVOCATION_ID"):
        return None
    import shutil
    return shutil.which("systemd-run")
