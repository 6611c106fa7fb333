"""MPS control daemons, one per shared GPU or MIG device: start, probe, configure, stop.

Each daemon has its own directories under ``/run/hostagent/mps/<uuid>/``: ``pipe`` (its
``CUDA_MPS_PIPE_DIRECTORY``), ``log`` and ``client``, and runs with a clean environment:
``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY`` and ``CUDA_VISIBLE_DEVICES=<uuid>``
(the device plugin leaves the last one out, its issue #2056: its daemons see every GPU).
The daemon is started through ``launch`` (see there: the shared ``/dev/shm`` its servers
and clients meet in) with ``-d`` and talked to through its front end,
``nvidia-cuda-mps-control`` reading commands on stdin, as the device plugin does (its
EchoPipeToControl).

What clients get: a running daemon's pipe directory holds ``control`` (the socket CUDA
clients connect to, mode 0666), ``control_privileged`` (root's: administration commands),
``control_lock`` (the daemon's flock), ``log`` (a FIFO its servers write their log to) and
``nvidia-cuda-mps-control.pid``, as published listings of running daemons show, and
nothing more while servers run: clients and servers find each other through ``control``.
The servers run on the host, as the daemon's children, and use the pipe directory there.
So a container is given ``client``, a directory holding one entry, ``control``, a hard link
to the daemon's socket (a UNIX socket is reached by its inode, whatever its name), mounted
read-only: connecting to a socket needs no write access to its file system, and nothing
else there is a client's to open, lock, replace or write. After a restart of the daemon
the link is replaced; containers mount the directory, so they see the new socket.

Which process a daemon is comes from the kernel, never from the pid file in its pipe
directory: after ``-d`` the daemon is found among the processes running the control
binary with ``-d`` and this pipe directory in their environment, and recorded (pid, start
time, executable: ``processes.ProcessRecord``) in the sharing state. Signals go to that
recorded process only, checked again right before (``processes.send``).

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

from .. import processes
from ..errors import NotFoundError, StateError
from ..hostroot import HostRoot
from ..processes import ProcessRecord

__all__ = ["MPS_ROOT", "PROBE", "MpsError", "daemon_dir", "pipe_dir", "log_dir", "client_dir", "shm_dir",
           "environment", "control_tool", "ask", "probe", "find", "leftovers", "start", "configure", "stop",
           "find_daemons", "shm_size", "unmount_shm", "ANSWER_TIMEOUT", "SOCKET"]

MPS_ROOT = "/run/hostagent/mps"
SOCKET = "control"          # the socket clients connect to, in the pipe directory
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


def client_dir(host: HostRoot, uuid: str) -> Path:
    """What containers mount (read-only): the daemon's socket, and nothing else."""
    return daemon_dir(host, uuid) / "client"


def shm_dir(host: HostRoot) -> Path:
    return host.host(MPS_ROOT) / "shm"


def control_tool(host: HostRoot) -> str:
    path = host.driver_tool("nvidia-cuda-mps-control")
    if path is not None:
        return str(path)
    raise NotFoundError("nvidia-cuda-mps-control is needed for MPS and was not found",
                        where=str(host.driver("usr/bin/nvidia-cuda-mps-control")),
                        hint="install the NVIDIA driver's MPS utilities (Debian: nvidia-cuda-mps)")


def environment(host: HostRoot, uuid: str, devices: list[str] | None = None) -> dict[str, str]:
    """The daemon's whole environment: nothing is inherited from the agent. ``uuid`` names
    the daemon (its device's, or an allocation's key); ``devices``: the devices it serves
    when they are not that one."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir(host, uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(log_dir(host, uuid)),
            "CUDA_VISIBLE_DEVICES": ",".join(devices) if devices else uuid,
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


def leftovers(host: HostRoot, uuids, known: dict[str, ProcessRecord | None]) -> set[str]:
    """The devices of ``uuids`` on whose pipe directory a control daemon runs that is not
    the one ``known`` records (one look at the processes for them all)."""
    rest = {str(pipe_dir(host, u)): u for u in uuids if not processes.current(known.get(u))}
    return set(_find(host, rest)) if rest else set()


def find(host: HostRoot, uuid: str) -> list[ProcessRecord]:
    """The processes running the control daemon on the device's pipe directory (by what the
    kernel shows of them: the control binary, ``-d``, the pipe directory in their
    environment)."""
    return _find(host, {str(pipe_dir(host, uuid)): uuid}).get(uuid, [])


def _find(host: HostRoot, pipes: dict[str, str]) -> dict[str, list[ProcessRecord]]:
    """uuid -> the daemons running on its pipe directory (``pipes``: pipe directory -> uuid)."""
    try:
        program = processes.program(control_tool(host))
    except (OSError, NotFoundError):
        return {}
    out: dict[str, list[ProcessRecord]] = {}
    for rec in processes.find(program, ("-d",)):
        env = processes.environment(rec) or {}
        uuid = pipes.get(env.get("CUDA_MPS_PIPE_DIRECTORY", ""))
        if uuid is not None:
            out.setdefault(uuid, []).append(rec)
    return out


def find_daemons(host: HostRoot) -> list[str]:
    """Devices that have a daemon directory (running or left over)."""
    try:
        return sorted(p.name for p in host.host(MPS_ROOT).iterdir() if p.name != "shm" and p.is_dir())
    except FileNotFoundError:
        return []


def outside(host: HostRoot, cmd: list[str], uuid: str | None) -> list[str]:
    """``cmd`` as it runs outside the agent's service: a transient unit of its own under
    systemd (``uuid``: the daemon's device; None: wait for it, as for the unmount)."""
    run = processes.systemd_run(host)
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
    """The defaults to send: the active thread percentage, and the pinned memory limit of
    each device the daemon sees (``pinned_memory_limits_mib``: index -> MiB; else
    ``pinned_memory_limit_mib`` for its one device, 0); a value left out is not sent."""
    out = []
    if values.get("active_thread_percentage") is not None:
        out.append(f"set_default_active_thread_percentage {values['active_thread_percentage']}")
    limits = values.get("pinned_memory_limits_mib")
    if limits is None and values.get("pinned_memory_limit_mib") is not None:
        limits = {0: values["pinned_memory_limit_mib"]}
    out += [f"set_default_device_pinned_mem_limit {i} {mib}M" for i, mib in sorted((limits or {}).items())]
    return out


def _link_client(host: HostRoot, uuid: str) -> None:
    """The client directory's ``control``: a hard link to the daemon's socket, replaced at once."""
    from ..fileio import ensure_dir
    folder = ensure_dir(client_dir(host, uuid), 0o755)
    tmp = folder / f".{SOCKET}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(pipe_dir(host, uuid) / SOCKET, tmp, follow_symlinks=False)
    except OSError as e:
        raise MpsError(f"the MPS control daemon of {uuid} answers but its socket cannot be given to clients: "
                       f"{e.strerror or e}", where=str(pipe_dir(host, uuid) / SOCKET)) from None
    os.replace(tmp, folder / SOCKET)


def _fresh_dirs(host: HostRoot, uuid: str) -> None:
    """An empty pipe directory (whatever an earlier daemon, or anyone, left there goes),
    the log directory and the client directory."""
    from ..fileio import ensure_dir
    shutil.rmtree(pipe_dir(host, uuid), ignore_errors=True)
    for d in (pipe_dir(host, uuid), log_dir(host, uuid), client_dir(host, uuid)):
        ensure_dir(d, 0o755)


def start(host: HostRoot, uuid: str, settings: dict, interpreter: str = sys.executable,
          import_path: str | None = None, adopt: bool = True,
          known: ProcessRecord | None = None, devices: list[str] | None = None) -> tuple[ProcessRecord, list[str]]:
    """Start the device's daemon, send its defaults and wait until it answers; (its process,
    notes from the launcher). ``known``: the process recorded for it. ``adopt``: the
    recorded daemon, if it runs and answers, is kept; else (a restart of one that stopped
    answering, or a daemon nobody recorded) whatever runs on its pipe directory is ended
    first, and the directory made anew."""
    if adopt and processes.current(known) and probe(host, uuid):
        _link_client(host, uuid)
        configure(host, uuid, settings)
        return known, []
    _end(host, uuid, known)
    from .launch import command
    _fresh_dirs(host, uuid)
    cmd = outside(host, command(interpreter, control_tool(host), shm_dir(host), shm_size(host),
                                environment(host, uuid, devices), import_path), uuid)
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
    found = find(host, uuid)
    if len(found) != 1:
        raise MpsError(f"the MPS control daemon of {uuid} answers, but {len(found)} processes run the control "
                       f"daemon on its pipe directory", where=str(pipe_dir(host, uuid)),
                       hint="stop them (echo quit | nvidia-cuda-mps-control with that CUDA_MPS_PIPE_DIRECTORY)")
    _link_client(host, uuid)
    return found[0], notes


def configure(host: HostRoot, uuid: str, settings: dict) -> None:
    """Send new defaults; they apply to the servers the daemon starts from now on."""
    answer = ask(host, uuid, [*_command(settings), PROBE])
    wanted = settings.get("active_thread_percentage")
    if _percentage(answer) is None or (wanted is not None and _percentage(answer) != float(wanted)):
        raise MpsError(f"the MPS control daemon of {uuid} did not take its defaults "
                       f"({'; '.join(answer or ['no answer'])})", where=str(log_dir(host, uuid)))


def stop(host: HostRoot, uuid: str, known: ProcessRecord | None = None, timeout: float = QUIT_TIMEOUT) -> None:
    """``quit``, as the device plugin stops its daemons; a daemon still there after
    ``timeout`` gets SIGTERM, then SIGKILL. Its directories go last. ``known``: the process
    recorded for it (else it is looked for)."""
    _end(host, uuid, known, quit_timeout=timeout)
    shutil.rmtree(daemon_dir(host, uuid), ignore_errors=True)


def _end(host: HostRoot, uuid: str, known: ProcessRecord | None, quit_timeout: float = 0.0) -> None:
    """End the device's daemon, each process that is one: ``quit`` first when
    ``quit_timeout``, then SIGTERM and SIGKILL, to the checked process only."""
    if processes.current(known):
        daemons = [known]
    else:
        daemons = find(host, uuid)
    if not daemons:
        return
    if quit_timeout:
        ask(host, uuid, ["quit"], quit_timeout)
        for rec in daemons:
            processes.wait_gone(rec, quit_timeout)
    for rec in daemons:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not processes.send(rec, sig) or processes.wait_gone(rec, 1.0):
                break


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
