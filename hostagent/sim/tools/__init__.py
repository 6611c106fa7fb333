"""Stand-ins for the NVIDIA driver's helper binaries, backed by a simulated node.

``hostagent.sim.driverroot`` writes one executable per tool into ``<root>/usr/bin``; each
runs ``hostagent.sim.tools.<module>.main(root, argv)`` and exits with its return value:

    nvidia-smi               nvidia_smi       list, query, reset, MIG mode and instances
    nvidia-cuda-mps-control  mps_control      MPS control daemon (-d/-f) and its front end
    nvidia-cuda-mps-server   mps_server       an MPS server, started by the control daemon
    nvidia-persistenced      persistenced     the persistence daemon
    modprobe                 modprobe         loading and unloading the nvidia modules

The tools run as ``python3 -I`` on every call, so this package and each module import
only what they use. The helpers here are shared by the two daemons.
"""

from __future__ import annotations

import os
import time

__all__ = ["format_line", "log_line", "read_pid", "detach", "init_done", "wait_init"]

_init_fd: int | None = None   # in a daemon: the write end of its init pipe


def format_line(who: str, message: str, pid: int | None = None) -> str:
    """``[2024-06-04 10:22:16.735 Control 12345] message``, the MPS log line shape."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    return f"[{stamp} {who} {os.getpid() if pid is None else pid:>5}] {message}"


def log_line(path: str | os.PathLike, who: str, message: str, pid: int | None = None) -> str:
    """Append one MPS-style log line to ``path``; returns the line."""
    line = format_line(who, message, pid)
    with open(path, "a") as f:
        f.write(line + "\n")
    return line


def read_pid(path: str | os.PathLike) -> int | None:
    """The pid a daemon's pid file holds; None for anything but a small regular file (a
    FIFO put in its place must not hang the simulated driver)."""
    from ...fileio import read_regular
    try:
        return int(read_regular(os.fspath(path), 64, follow=False)[0].decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def detach(*, double_fork: bool = True) -> int | None:
    """Fork a daemon the way the real tools do.

    In the caller (the foreground process) this returns the read end of an init pipe,
    on which the daemon writes one byte (1 = ready, 0 = failed) or which it closes on
    failure; in the daemon it returns None. The daemon gets a new session, ``/`` as
    working directory and stdio on /dev/null, so a caller capturing our output is not
    kept waiting by it.
    """
    global _init_fd
    r, w = os.pipe()
    child = os.fork()
    if child > 0:
        os.close(w)
        if double_fork:
            os.waitpid(child, 0)   # the intermediate process exits at once
        return r
    os.close(r)
    os.setsid()
    if double_fork and os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
    _init_fd = w
    return None


def init_done(ok: bool) -> None:
    """In the daemon: tell the foreground process whether start-up worked."""
    global _init_fd
    fd, _init_fd = _init_fd, None
    if fd is None:
        return
    try:
        os.write(fd, b"\1" if ok else b"\0")
    except OSError:
        pass
    finally:
        os.close(fd)


def wait_init(fd: int, timeout: float = 10.0) -> bool:
    """In the foreground process: wait for the daemon's start-up verdict."""
    import select
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        data = os.read(fd, 1) if ready else b""
    finally:
        os.close(fd)
    return data == b"\1"
