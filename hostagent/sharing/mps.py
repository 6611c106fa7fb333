"""MPS control daemons, one per shared GPU or MIG device: start, probe, configure, stop.

Each daemon has its own directories under ``/run/hostagent/mps/<uuid>/`` (``pipe``, ``log``)
and runs with a clean environment: ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``
and ``CUDA_VISIBLE_DEVICES=<uuid>`` (the device plugin leaves the last one out, its issue
#2056: its daemons see every GPU). The daemon is started through ``launch`` (see there:
the shared ``/dev/shm`` its servers and clients meet in) with ``-d`` and talked to through
its front end, ``nvidia-cuda-mps-control`` reading commands on stdin, as the device plugin
does (its EchoPipeToControl). It writes ``nvidia-cuda-mps-control.pid`` in its pipe
directory (NVIDIA's MPS documentation), which is how a restarted agent finds it again.

Limits use the device index the daemon sees: with ``CUDA_VISIBLE_DEVICES`` set, "the
devices will be remapped by the MPS server" (MPS documentation), so its one device is 0.

Under systemd the daemon (and the unmount of the shared /dev/shm) runs in a transient unit
of its own (``systemd-run``, ``hostagent-mps-<uuid>-<random>.service``): outside the agent's sandbox,
whose seccomp filter, namespaces and memory limit are the agent's, not what an MPS server
needs, and outside its cgroup, so a restart of the agent leaves the daemons serving.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import NotFoundError, StateError
from ..hostroot import HostRoot

__all__ = ["MPS_ROOT", "PROBE", "MpsError", "daemon_dir", "pipe_dir", "log_dir", "shm_dir", "environment",
           "control_tool", "ask", "probe", "daemon_pid", "start", "configure", "stop", "find_daemons",
           "shm_size", "unmount_shm", "alive", "ANSWER_TIMEOUT"]

MPS_ROOT = "/run/hostagent/mps"
PID_FILE = "nvidia-cuda-mps-control.pid"
PROBE = "get_default_active_thread_percentage"     # the device plugin's AssertHealthy
ANSWER_TIMEOUT = 5.0       # one front-end run: a daemon answers in milliseconds; the rest is margin
READY_TIMEOUT = 10.0       # from -d until the daemon answers
QUIT_TIMEOUT = 5.0         # from quit until the daemon has exited, then SIGTERM, then SIGKILL
SHM_FALLBACK = "65536k"    # the device plugin's, when /proc/meminfo cannot be read


class MpsError(StateError):
    code = "mps_error"


def daemon_dir(host: HostRoot, uuid: str) -> Path:
    return host.host(MPS_ROOT) / uuid


def pipe_dir(host: HostRoot, uuid: str) -> Path:
    return daemon_dir(host, uuid) / "pipe"


def log_dir(host: HostRoot, uuid: str) -> Path:
    return daemon_dir(host, uuid) / "log"


def shm_dir(host: HostRoot) -> Path:
    return host.host(MPS_ROOT) / "shm"


def control_tool(host: HostRoot) -> str:
    path = host.driver_tool("nvidia-cuda-mps-control")
    if path is not None:
        return str(path)
    raise NotFoundError("nvidia-cuda-mps-control is needed for MPS and was not found",
                        where=str(host.driver("usr/bin/nvidia-cuda-mps-control")),
                        hint="install the NVIDIA driver's MPS utilities (Debian: nvidia-cuda-mps)")


def environment(host: HostRoot, uuid: str) -> dict[str, str]:
    """The daemon's whole environment: nothing is inherited from the agent."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir(host, uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(log_dir(host, uuid)),
            "CUDA_VISIBLE_DEVICES": uuid,
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def ask(host: HostRoot, uuid: str, commands: list[str], timeout: float = ANSWER_TIMEOUT) -> list[str] | None:
    """The front end's answer lines to ``commands`` (one run); None when no daemon answers."""
    try:
        done = subprocess.run([control_tool(host)], input="".join(c + "\n" for c in commands),
                              env=environment(host, uuid), capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if done.returncode != 0:
        return None
    return [line for line in done.stdout.splitlines() if line.strip()]


def _percentage(lines: list[str] | None) -> float | None:
    try:
        return float(lines[-1]) if lines else None
    except ValueError:
        return None


def probe(host: HostRoot, uuid: str, timeout: float = ANSWER_TIMEOUT) -> bool:
    """Does the daemon answer (a number to get_default_active_thread_percentage)?"""
    return _percentage(ask(host, uuid, [PROBE], timeout)) is not None


def daemon_pid(host: HostRoot, uuid: str) -> int | None:
    """The pid its pid file names, if that process runs."""
    try:
        pid = int((pipe_dir(host, uuid) / PID_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and alive(pid) else None


def alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def find_daemons(host: HostRoot) -> list[str]:
    """Devices that have a daemon directory (running or left over)."""
    try:
        return sorted(p.name for p in host.host(MPS_ROOT).iterdir() if p.name != "shm" and p.is_dir())
    except FileNotFoundError:
        return []


def _systemd(host: HostRoot) -> str | None:
    """``systemd-run``'s path when the agent is a systemd service on a real host; None else."""
    if host.simulated or not os.environ.get("INVOCATION_ID"):
        return None
    return shutil.which("systemd-run")


def outside(host: HostRoot, cmd: list[str], uuid: str | None) -> list[str]:
    """``cmd`` as it runs outside the agent's service: a transient unit of its own under
    systemd (``uuid``: the daemon's device; None: wait for it, as for the unmount)."""
    run = _systemd(host)
    if run is None:
        return cmd
    if uuid is None:
        return [run, "--quiet", "--collect", "--wait", "--description=hostagent: unmount the MPS /dev/shm",
                "--", *cmd]
    # A name of its own each time: the unit of a daemon just ended may not be collected yet.
    return [run, "--quiet", "--collect", f"--unit=hostagent-mps-{uuid}-{os.urandom(3).hex()}",
            f"--description=hostagent: MPS control daemon of {uuid}", "--service-type=forking", "--", *cmd]


def shm_size(host: HostRoot) -> str:
    """Half of MemTotal, as the device plugin sizes its MPS /dev/shm (mount-shm.go)."""
    try:
        for line in host.proc("meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                number, *unit = line.split(":", 1)[1].split()
                return f"{int(number) // 2}{unit[0][0] if unit else ''}"
    except (OSError, ValueError):
        pass
    return SHM_FALLBACK


def _command(values: dict) -> list[str]:
    return [f"set_default_active_thread_percentage {values['active_thread_percentage']}",
            f"set_default_device_pinned_mem_limit 0 {values['pinned_memory_limit_mib']}M"]


def start(host: HostRoot, uuid: str, settings: dict, interpreter: str = sys.executable,
          import_path: str | None = None, adopt: bool = True) -> tuple[int, list[str]]:
    """Start the device's daemon, send its defaults and wait until it answers; (pid, notes
    from the launcher). ``adopt``: one that answers already is kept; else (a restart of one
    that stopped answering) whatever runs is ended first."""
    if adopt and daemon_pid(host, uuid) is not None and probe(host, uuid):
        configure(host, uuid, settings)
        return daemon_pid(host, uuid), []
    _kill_leftover(host, uuid)
    from ..fileio import ensure_dir
    from .launch import command
    for d in (pipe_dir(host, uuid), log_dir(host, uuid)):
        ensure_dir(d, 0o755)
    cmd = outside(host, command(interpreter, control_tool(host), shm_dir(host), shm_size(host),
                                environment(host, uuid), import_path), uuid)
    # Output to a file, not a pipe: a daemon that keeps the descriptors it inherited would
    # otherwise hold the pipe open, and the run would wait for its end.
    with tempfile.TemporaryFile("w+") as out:
        try:
            done = subprocess.run(cmd, env={}, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  timeout=READY_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise MpsError(f"the MPS control daemon of {uuid} did not start in {READY_TIMEOUT:g} s",
                           where=str(log_dir(host, uuid))) from None
        out.seek(0)
        said = out.read()
    notes = [line for line in said.splitlines() if line.startswith("note: ")]
    if done.returncode != 0:
        detail = "; ".join(ln for ln in said.splitlines() if ln.strip()) or "no output"
        raise MpsError(f"the MPS control daemon of {uuid} did not start (exit {done.returncode}: {detail})",
                       where=str(log_dir(host, uuid)), hint="see control.log there")
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        answer = ask(host, uuid, [*_command(settings), PROBE])
        if _percentage(answer) is not None:
            break
        if time.monotonic() >= deadline:
            raise MpsError(f"the MPS control daemon of {uuid} started but does not answer",
                           where=str(log_dir(host, uuid)), hint="see control.log there")
        time.sleep(0.05)
    pid = daemon_pid(host, uuid)
    if pid is None:
        raise MpsError(f"the MPS control daemon of {uuid} answers but wrote no pid file",
                       where=str(pipe_dir(host, uuid) / PID_FILE))
    return pid, notes


def configure(host: HostRoot, uuid: str, settings: dict) -> None:
    """Send new defaults; they apply to the servers the daemon starts from now on."""
    answer = ask(host, uuid, [*_command(settings), PROBE])
    if _percentage(answer) != float(settings["active_thread_percentage"]):
        raise MpsError(f"the MPS control daemon of {uuid} did not take its defaults "
                       f"({'; '.join(answer or ['no answer'])})", where=str(log_dir(host, uuid)))


def stop(host: HostRoot, uuid: str, timeout: float = QUIT_TIMEOUT) -> None:
    """``quit``, as the device plugin stops its daemons; a daemon still there after
    ``timeout`` gets SIGTERM, then SIGKILL. Its directories go last."""
    pid = daemon_pid(host, uuid)
    if pid is not None:
        ask(host, uuid, ["quit"], timeout)
        _wait_gone(pid, timeout)
    _kill_leftover(host, uuid)
    shutil.rmtree(daemon_dir(host, uuid), ignore_errors=True)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _kill_leftover(host: HostRoot, uuid: str) -> None:
    """A daemon that no longer answers: ended by signal (its pid file names it)."""
    pid = daemon_pid(host, uuid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if pid is None or not alive(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if _wait_gone(pid, 1.0):
            return


def unmount_shm(host: HostRoot, interpreter: str = sys.executable) -> None:
    """Take the shared /dev/shm away once no daemon uses it (not mounted: nothing to do)."""
    from .launch import unmount_command
    path = shm_dir(host)
    if os.path.ismount(path):
        done = subprocess.run(outside(host, unmount_command(interpreter, path), None), env={},
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise MpsError(f"cannot unmount the shared /dev/shm: {done.stderr.strip() or done.returncode}",
                           where=str(path))
    for leftover in (path, path.with_name("shm.lock"), path.parent):
        try:
            leftover.unlink() if leftover.name == "shm.lock" else leftover.rmdir()
        except OSError:
            pass
