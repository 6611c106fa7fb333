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

Which process a daemon is comes from what the agent started, never from what another
process shows of itself (its executable, arguments and environment, which any local user,
or a container given the host's binary, chooses) nor from the pid file in its pipe
directory: the launcher is the subreaper of what ``-d`` forks, and names the one process
left of it (``launch``); under systemd the daemon is the one left in its transient unit's
cgroup. It must run as the agent's user and run the control binary; it is then recorded
(pid, start time, executable: ``processes.ProcessRecord``) in the sharing state. Signals go
to that recorded process only, checked again right before (``processes.send``). A daemon on
the device's pipe directory that no record names (started by an agent killed before it
recorded it) is asked to ``quit`` through that directory, root's alone, where only a daemon
the agent started can listen: never signalled. A process of another user, or one outside
the agent's launch, is not a daemon of the agent's: it blocks no start and is never
signalled.

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
           "environment", "control_tool", "ask", "probe", "leftovers", "start", "configure", "stop",
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
    """The devices of ``uuids`` whose pipe directory has a daemon answering that no record
    of ``known`` names (the agent started it and was killed before it recorded it): a
    daemon answers there only if the agent started it (the folder is root's)."""
    from concurrent.futures import ThreadPoolExecutor
    rest = [u for u in uuids if not processes.current(known.get(u)) and (pipe_dir(host, u) / SOCKET).exists()]
    if not rest:
        return set()
    with ThreadPoolExecutor(min(8, len(rest))) as pool:
        return {u for u, ok in zip(rest, pool.map(lambda u: probe(host, u), rest)) if ok}


def find_daemons(host: HostRoot) -> list[str]:
    """Devices that have a daemon directory (running or left over)."""
    try:
        return sorted(p.name for p in host.host(MPS_ROOT).iterdir() if p.name != "shm" and p.is_dir())
    except FileNotFoundError:
        return []


def outside(host: HostRoot, cmd: list[str], uuid: str | None, unit: str | None = None) -> list[str]:
    """``cmd`` as it runs outside the agent's service: under systemd, the transient unit
    ``unit`` of the daemon of ``uuid`` (``uuid`` None: wait for it, as for the unmount)."""
    run = processes.systemd_run(host)
    if run is None:
        return cmd
    if uuid is None:
        return [run, "--quiet", "--collect", "--wait", "--description=hostagent: unmount the MPS /dev/shm",
                "--", *cmd]
    return [run, "--quiet", "--collect", f"--unit={unit}", f"--description=hostagent: MPS control daemon of {uuid}",
            "--service-type=forking", "--", *cmd]


def _unit_daemon(unit: str) -> int | None:
    """The daemon left in the transient unit's cgroup (only root puts processes there), once
    the forks of ``-d`` are done."""
    from .launch import SETTLE_SECONDS, settled
    try:
        group = subprocess.run(["systemctl", "show", "--property=ControlGroup", "--value", unit],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not group:
        return None
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        for hierarchy in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd"):
            try:
                with open(f"{hierarchy}{group}/cgroup.procs") as f:
                    pid = settled([int(p) for p in f.read().split()])
            except (OSError, ValueError):
                continue
            if pid is not None:
                return pid
        time.sleep(0.01)
    return None


def _launched(host: HostRoot, uuid: str, said: str, unit: str | None) -> ProcessRecord:
    """The daemon the launch started: the process the launcher named (or, under systemd, the
    one its unit holds), checked to be the same process, the control binary and the
    agent's user's; MpsError otherwise."""
    from .launch import start_ticks
    pid, ticks = None, None
    for line in said.splitlines():
        if line.startswith("daemon "):
            _, pid_text, ticks = line.split()
            pid = int(pid_text)
    if unit is not None:
        pid, ticks = _unit_daemon(unit), None
    rec = processes.record(pid) if pid else None
    try:
        ours = (rec is not None and os.stat(f"/proc/{pid}").st_uid == os.geteuid()
                and rec.exe == processes.program(control_tool(host)).exe
                and (ticks is None or start_ticks(pid) == int(ticks)))
    except OSError:
        ours = False
    if not ours:
        raise MpsError(f"the MPS control daemon of {uuid} started, but its process could not be told "
                       f"({'no process' if rec is None else f'pid {pid} is not it'})", where=str(log_dir(host, uuid)),
                       hint="see control.log there")
    return rec


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
    # A name of its own each time: the unit of a daemon just ended may not be collected yet.
    unit = f"hostagent-mps-{uuid}-{os.urandom(3).hex()}.service" if processes.systemd_run(host) else None
    cmd = outside(host, command(interpreter, control_tool(host), shm_dir(host), shm_size(host),
                                environment(host, uuid, devices), import_path), uuid, unit)
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
    daemon = _launched(host, uuid, said, unit)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        answer = ask(host, uuid, [*_command(settings), PROBE])
        if _percentage(answer) is not None:
            break
        if time.monotonic() >= deadline:
            _end(host, uuid, daemon)
            raise MpsError(f"the MPS control daemon of {uuid} started but does not answer",
                           where=str(log_dir(host, uuid)), hint="see control.log there")
        time.sleep(0.05)
    _link_client(host, uuid)
    return daemon, notes


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
    """End the device's daemon: the recorded one (``quit`` first when ``quit_timeout``, then
    SIGTERM and SIGKILL, to that checked process only); without one, whatever answers on
    its pipe directory is asked to ``quit`` and nothing is signalled."""
    if not processes.current(known):
        if (pipe_dir(host, uuid) / SOCKET).exists():
            ask(host, uuid, ["quit"], quit_timeout or ANSWER_TIMEOUT)
        return
    if quit_timeout:
        ask(host, uuid, ["quit"], quit_timeout)
        processes.wait_gone(known, quit_timeout)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not processes.send(known, sig) or processes.wait_gone(known, 1.0):
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
