"""Starts one MPS control daemon where its clients can reach its servers (standard library
and ``hostagent.hooks.sysc`` only: it runs as ``python3 -I -S``).

MPS clients and servers meet in ``/dev/shm`` as well as in the pipe directory. A client in a
container has its own ``/dev/shm``, so the device plugin mounts one tmpfs (``<mps root>/shm``,
``rw,nosuid,nodev,noexec,relatime,size=<MemTotal/2>``, mount-shm.go) as ``/dev/shm`` in its
daemon's container and in every client container. A daemon started by hostagent runs on the
host, so this launcher gives it the same view: it mounts the shared tmpfs once (at
``/run/hostagent/mps/shm``, where containers get it from), enters a mount namespace of its
own whose mounts follow the host's (slave), binds the tmpfs over ``/dev/shm`` there, and
runs ``nvidia-cuda-mps-control -d`` with exactly the environment named on its command line
(its own may hold what Python adds, such as a coerced LC_CTYPE). The servers the daemon starts
inherit the namespace.

The launcher is the subreaper of what it starts (``PR_SET_CHILD_SUBREAPER``): when ``-d``
returns, the daemon it forked is the launcher's child, the one process left, and the
launcher prints ``daemon PID START`` (its start time in clock ticks, as /proc says) on
stdout. That is how the agent knows its daemon: from what it started, never from what a
process shows of itself.

Without the privilege to mount (not root), the daemon starts all the same and a ``note:``
line on stderr says what clients in containers will miss. ``--unmount SHM_DIR`` takes the
shared tmpfs away once no daemon is left.

    launch SHM_DIR SIZE CONTROL_BINARY [NAME=VALUE ...]
    launch --unmount SHM_DIR
"""

from __future__ import annotations

import os
import sys

__all__ = ["main", "command", "unmount_command", "settled", "start_ticks"]

MS_SLAVE = 0x80000
PR_SET_CHILD_SUBREAPER = 36
SETTLE_SECONDS = 10.0       # from -d's return until the daemon's forks are done


def command(interpreter: str, control: str, shm: os.PathLike, size: str, env: dict[str, str],
            import_path: str | None = None) -> list[str]:
    """The launcher's command line (``-I -S``: no environment, no site; the one directory
    hostagent is installed in appended); ``env`` is the daemon's whole environment."""
    if import_path is None:
        from ..cdi.spec import HOOK_IMPORT_PATH
        import_path = HOOK_IMPORT_PATH
    boot = (f"import sys;sys.path.append({import_path!r});"
            "from hostagent.sharing.launch import main;sys.exit(main(sys.argv[1:]))")
    return [interpreter, "-I", "-S", "-c", boot, os.fspath(shm), size, control,
            *(f"{k}={v}" for k, v in env.items())]


def _shared_tmpfs(shm: str, size: str) -> None:
    import fcntl

    from ..hooks import sysc
    os.makedirs(shm, 0o755, exist_ok=True)
    with open(shm + ".lock", "a") as lock:      # daemons start in parallel: mount once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.ismount(shm):
            sysc.mount("shm", shm, "tmpfs", sysc.MS_NOSUID | sysc.MS_NODEV | sysc.MS_NOEXEC | sysc.MS_RELATIME,
                       f"size={size},mode=1777")


def _private_dev_shm(shm: str) -> None:
    from ..hooks import sysc
    sysc.unshare(sysc.CLONE_NEWNS)
    sysc.mount(None, "/", None, sysc.MS_REC | MS_SLAVE)
    sysc.mount(shm, "/dev/shm", None, sysc.MS_BIND)


def unmount_command(interpreter: str, shm: os.PathLike, import_path: str | None = None) -> list[str]:
    return [*command(interpreter, "", shm, "", {}, import_path)[:5], "--unmount", os.fspath(shm)]


def _unmount(shm: str) -> int:
    from ..hooks import sysc
    try:
        if os.path.ismount(shm):
            sysc.umount2(shm, sysc.MNT_DETACH)      # clients still holding it keep their view
    except OSError as e:
        print(f"cannot unmount {shm}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state first); None: gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks after boot (field 22 of /proc/PID/stat)."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _children(pids) -> dict[int, list[int]]:
    """pid -> its live children, for each of ``pids``."""
    out: dict[int, list[int]] = {p: [] for p in pids}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[0] != "Z" and int(fields[1]) in out:
                out[int(fields[1])].append(int(entry))
    return out


def _exe(pid: int):
    try:
        st = os.stat(f"/proc/{pid}/exe")
        return st.st_dev, st.st_ino
    except OSError:
        return None


def settled(pids: list[int]) -> int | None:
    """The daemon among ``pids`` (what ``-d`` left: the launcher's children, or a unit's
    processes): the one process there, unless it still has a child running its own
    executable (the middle of a double fork, about to exit); None until then."""
    live = [p for p in pids if (_stat(p) or ["Z"])[0] != "Z"]
    if len(live) != 1:
        return None
    [pid] = live
    exe = _exe(pid)
    return None if exe is None or any(_exe(c) == exe for c in _children([pid])[pid]) else pid


def _run(control: str, env: dict[str, str]) -> int:
    """``control -d`` as a child; once it returns, its daemon named on stdout."""
    import time
    from ..hooks import sysc
    sysc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(control, [control, "-d"], env)
        except OSError as e:
            print(f"cannot run {control}: {e.strerror}", file=sys.stderr, flush=True)
        os._exit(127)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        return code
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        while True:                                    # what -d left that has exited already
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        daemon = settled(_children([os.getpid()])[os.getpid()])
        if daemon is not None:
            print(f"daemon {daemon} {start_ticks(daemon)}", flush=True)
            return 0
        if time.monotonic() > deadline:
            print(f"{control} -d returned, but no one daemon process was left of it", file=sys.stderr)
            return 1
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--unmount":
        return _unmount(argv[1])
    if len(argv) < 3 or not all("=" in a for a in argv[3:]):
        print("usage: launch SHM_DIR SIZE CONTROL_BINARY [NAME=VALUE ...]", file=sys.stderr)
        return 2
    shm, size, control = argv[:3]
    env = dict(a.split("=", 1) for a in argv[3:])
    try:
        _shared_tmpfs(shm, size)
        _private_dev_shm(shm)
    except OSError as e:
        print(f"note: MPS clients in containers cannot reach this daemon's servers: no shared /dev/shm "
              f"({e.strerror or e})", file=sys.stderr, flush=True)
    return _run(control, env)
