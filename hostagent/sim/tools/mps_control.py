"""``nvidia-cuda-mps-control`` stand-in: the MPS control daemon and its front end.

Reproduced behaviour:

* ``-d`` starts the control daemon in the background (fork, setsid, fork; stdio on
  /dev/null) and returns once it listens; ``-f`` runs it in the foreground. ``-M``
  (multi-user) is accepted and logged.
* Directories come from ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY``; when a
  variable is unset its default (``/tmp/nvidia-mps``, ``/var/log/nvidia-mps``) is taken
  inside the simulated root. Both are created. The daemon listens on the UNIX socket
  ``<pipe>/control``, writes ``<pipe>/nvidia-cuda-mps-control.pid`` and holds an flock on
  ``<pipe>/control_lock``: a second daemon on the same pipe directory is refused with
  "An instance of this daemon is already running" (stderr, exit 1).
* ``control.log`` in the log directory gets the real daemon's lines
  (``[2024-06-04 10:22:16.735 Control 12345] Starting control daemon using socket ...``,
  ``NEW UI``, ``Cmd:...``, ``UI closed``, ``Starting new server ...``, ``Exit``), plus
  which devices ``CUDA_VISIBLE_DEVICES`` limits the daemon (and its servers) to.
* Without ``-d``/``-f`` it is the front end: commands are read from stdin, one a line,
  each sent to the daemon and its reply printed. No daemon: "Cannot find MPS control
  daemon process" on stderr, exit 1; a connection lost mid-command also exits 1. A
  rejected command prints its error on stdout and still exits 0, as the man page says.
* Commands: ``get_server_list``, ``start_server -uid UID`` (spawns the
  ``nvidia-cuda-mps-server`` stand-in from ``<root>/usr/bin`` as a child and waits for it
  to create its contexts; a server the compute mode refuses, PROHIBITED or an
  EXCLUSIVE_PROCESS device another process holds, makes it answer "Failed to start server:
  ..." with CUDA's reason, this simulator's wording of what a client would be told),
  ``shutdown_server PID [-f]``, ``get_client_list PID``, ``quit [-t SECONDS]`` (stops
  the servers, removes the socket and pid file, logs ``Exit``),
  ``set_default_active_thread_percentage N`` / ``get_default_active_thread_percentage``
  (``N.0``), ``set_active_thread_percentage PID N`` / ``get_active_thread_percentage
  PID``, ``set_default_device_pinned_mem_limit DEV VALUE`` /
  ``get_default_device_pinned_mem_limit DEV`` (VALUE like ``1024M`` or ``2G``; unset reads
  as ``0``), ``set_default_client_priority N`` / ``get_default_client_priority``.
  Anything else replies ``Unrecognized command``; bad arguments reply ``Invalid
  argument``.
* SIGTERM or SIGINT stop the daemon as ``quit`` does.

Simplifications: one connection per command; servers run as the daemon's user whatever
``-uid`` says; replies to unknown server PIDs and unset pinned-memory limits are this
simulator's wording.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from .. import unixsock
from . import detach, format_line, init_done, log_line, wait_init

__all__ = ["main"]

SOCKET, PID_FILE, LOCK_FILE = "control", "nvidia-cuda-mps-control.pid", "control_lock"
END = b"\0"   # terminates every reply, so a lost daemon is told apart from an empty reply


def dirs(root: str) -> tuple[Path, Path]:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or os.path.join(root, "tmp/nvidia-mps")
    logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or os.path.join(root, "var/log/nvidia-mps")
    return Path(pipe).absolute(), Path(logs).absolute()


def main(root: str, argv: list[str]) -> int:
    flags = set(argv)
    if flags - {"-d", "-f", "-M", "-h", "--help"} or {"-d", "-f"} <= flags:
        print("Usage: nvidia-cuda-mps-control [-d | -f] [-M]", file=sys.stderr)
        return 1
    if flags & {"-h", "--help"}:
        print("Usage: nvidia-cuda-mps-control [-d | -f] [-M]\n"
              "  -d  start the MPS control daemon in the background\n"
              "  -f  start the MPS control daemon in the foreground\n"
              "  -M  multi-user mode\n"
              "Without options: read commands from stdin and send them to the daemon.")
        return 0
    pipe, logs = dirs(root)
    if "-d" in flags or "-f" in flags:
        return _start(root, pipe, logs, foreground="-f" in flags, multi_user="-M" in flags)
    return _front_end(pipe)


# ---- front end ---------------------------------------------------------------------

def _ask(pipe: Path, command: str) -> str | None:
    """The daemon's reply to one command; None if there is no daemon or it went away."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(30)
        unixsock.connect(s, pipe / SOCKET)
        s.sendall(command.encode() + b"\n")
        data = b""
        while not data.endswith(END):
            chunk = s.recv(65536)
            if not chunk:
                return None
            data += chunk
        return data[:-1].decode()
    except OSError:
        return None
    finally:
        s.close()


def _front_end(pipe: Path) -> int:
    if _ask(pipe, "") is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        reply = _ask(pipe, command)
        if reply is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        if reply:
            print(reply, flush=True)
        if command.split()[0] == "quit":
            break
    return 0


# ---- daemon ------------------------------------------------------------------------

def _start(root: str, pipe: Path, logs: Path, *, foreground: bool, multi_user: bool) -> int:
    import fcntl

    try:
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        lock = open(pipe / LOCK_FILE, "a")
    except OSError as e:
        print(f"Cannot create the MPS pipe or log directory: {e}", file=sys.stderr)
        return 1
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if not foreground:
        fd = detach()
        if fd is not None:           # the foreground process: the daemon keeps the lock
            lock.close()
            return 0 if wait_init(fd) else 1
    try:
        daemon = Daemon(root, pipe, logs, multi_user, foreground)
        return daemon.run()
    except BaseException:
        init_done(False)
        raise


class Daemon:
    def __init__(self, root: str, pipe: Path, logs: Path, multi_user: bool, foreground: bool):
        self.root, self.pipe, self.logs, self.multi_user = Path(root), pipe, logs, multi_user
        self.foreground = foreground
        self.servers: dict[int, object] = {}        # pid -> subprocess.Popen
        self.server_uid: dict[int, int] = {}
        self.server_atp: dict[int, float] = {}
        self.default_atp = 100.0
        self.pinned: dict[str, str] = {}
        self.priority = 0
        self.stopping = False
        self.sock: socket.socket | None = None

    def log(self, message: str) -> None:
        try:
            log_line(self.logs / "control.log", "Control", message)
        except OSError:
            pass
        if self.foreground:          # -f also shows the log on the terminal
            try:
                print(format_line("Control", message), flush=True)
            except OSError:
                pass

    def run(self) -> int:
        import select
        import signal

        path = self.pipe / SOCKET
        if path.exists() or path.is_symlink():
            path.unlink()              # stale: we hold the lock, so no daemon owns it
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unixsock.bind(self.sock, path)
        self.sock.listen(32)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)   # wakes select when a server dies
        self._log_startup()
        init_done(True)
        try:
            while not self.stopping:
                ready, _, _ = select.select([self.sock, wake_r], [], [], 5)
                if wake_r in ready:
                    try:
                        os.read(wake_r, 512)
                    except BlockingIOError:
                        pass
                self._reap()
                if self.sock in ready and not self.stopping:
                    self._serve_one()
        finally:
            self._shutdown()    # also on a crash: never leave a socket nobody answers
        return 0

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def _log_startup(self) -> None:
        import json
        try:
            facts = json.loads((self.root / ".sim/node.json").read_text())
            version = facts["cuda_driver_version"]
        except (OSError, ValueError, KeyError):
            version = "unknown"
        self.log(f"Starting control daemon using socket {self.pipe / SOCKET}")
        self.log(f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={self.pipe}")
        self.log(f"CUDA MPS Control binary version: {version}")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            self.log("CUDA_VISIBLE_DEVICES is not set: serving all devices")
        else:
            self.log(f"CUDA_VISIBLE_DEVICES={visible}: serving only these devices")
        if self.multi_user:
            self.log("Multi-user mode (-M) enabled")

    def _serve_one(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                command = data.decode(errors="replace").strip()
                if not command:            # a front end checking that we are here
                    conn.sendall(END)
                    return
                self.log("NEW UI")
                self.log(f"Cmd:{command}")
                reply = self.handle(command)
                if reply:
                    self.log(reply)
                conn.sendall(reply.encode() + END)
                if self.sock is not None:      # not after quit: the log ends with Exit
                    self.log("UI closed")
            except OSError:
                pass

    # ---- commands ------------------------------------------------------------------

    def handle(self, command: str) -> str:
        name, *args = command.split()
        fn = getattr(self, f"cmd_{name}", None)
        if fn is None:
            return "Unrecognized command"
        try:
            return fn(*args)
        except (TypeError, ValueError):
            return "Invalid argument"

    def cmd_get_server_list(self) -> str:
        self._reap()
        return "\n".join(str(pid) for pid in self.servers)

    def cmd_start_server(self, flag: str, uid: str) -> str:
        if flag != "-uid":
            raise ValueError(flag)
        uid_n = int(uid)
        self._reap()
        if uid_n in self.server_uid.values():
            return ""
        import subprocess
        from .mps_server import READY_ENV
        ready_r, ready_w = os.pipe()
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe),
                   CUDA_MPS_LOG_DIRECTORY=str(self.logs), **{READY_ENV: str(ready_w)})
        try:
            proc = subprocess.Popen([str(self.root / "usr/bin/nvidia-cuda-mps-server")], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, pass_fds=(ready_w,))
        except OSError as e:
            self.log(f"Failed to start server for user {uid_n}: {e}")
            return f"Failed to start server: {e.strerror}"
        finally:
            os.close(ready_w)
        self.servers[proc.pid] = proc
        self.server_uid[proc.pid] = uid_n
        self.server_atp[proc.pid] = self.default_atp
        self.log(f"Starting new server {proc.pid} for user {uid_n}")
        verdict = _read_verdict(ready_r)
        if verdict != "1":
            proc.wait()
            self._reap()
            why = verdict[1:] or "the server exited"
            self.log(f"Server {proc.pid} failed to start: {why}")
            return f"Failed to start server: {why}"
        return ""

    def cmd_shutdown_server(self, pid: str, *force: str) -> str:
        import signal
        if force not in ((), ("-f",)):
            raise ValueError(force)
        proc = self.servers.get(int(pid))
        if proc is None:
            return f"Server {pid} not found"
        proc.send_signal(signal.SIGKILL if force else signal.SIGTERM)
        self.log(f"Server {pid} is shutting down{' (forced)' if force else ''}")
        return ""

    def cmd_get_client_list(self, pid: str) -> str:
        if int(pid) not in self.servers:
            return f"Server {pid} not found"
        return ""

    def cmd_quit(self, *args: str) -> str:
        if args and (len(args) != 2 or args[0] != "-t" or int(args[1]) < 0):
            raise ValueError(args)
        self.stopping = True
        self._shutdown(timeout=float(args[1]) if args else 5.0)
        return ""

    def cmd_set_default_active_thread_percentage(self, value: str) -> str:
        self.default_atp = _percentage(value)
        return ""

    def cmd_get_default_active_thread_percentage(self) -> str:
        return f"{self.default_atp:.1f}"

    def cmd_set_active_thread_percentage(self, pid: str, value: str) -> str:
        if int(pid) not in self.servers:
            return f"Server {pid} not found"
        self.server_atp[int(pid)] = _percentage(value)
        return ""

    def cmd_get_active_thread_percentage(self, pid: str) -> str:
        if int(pid) not in self.servers:
            return f"Server {pid} not found"
        return f"{self.server_atp[int(pid)]:.1f}"

    def cmd_set_default_device_pinned_mem_limit(self, device: str, value: str) -> str:
        number, unit = value[:-1], value[-1:].upper()
        if unit not in ("M", "G") or not number.isdigit():
            raise ValueError(value)
        self.pinned[device] = f"{int(number)}{unit}"
        return ""

    def cmd_get_default_device_pinned_mem_limit(self, device: str) -> str:
        return self.pinned.get(device, "0")

    def cmd_set_default_client_priority(self, value: str) -> str:
        if value not in ("0", "1"):
            raise ValueError(value)
        self.priority = int(value)
        return ""

    def cmd_get_default_client_priority(self) -> str:
        return str(self.priority)

    # ---- servers and shutdown ------------------------------------------------------

    def _reap(self) -> None:
        for pid, proc in list(self.servers.items()):
            status = proc.poll()
            if status is not None:
                self.log(f"Server {pid} exited with status {status}")
                del self.servers[pid]
                self.server_uid.pop(pid, None)
                self.server_atp.pop(pid, None)

    def _shutdown(self, timeout: float = 5.0) -> None:
        import signal
        import time
        if self.sock is None:
            return
        for proc in self.servers.values():
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.servers.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except Exception:          # subprocess.TimeoutExpired
                proc.kill()
                proc.wait()
        self._reap()
        self.sock.close()
        self.sock = None
        for name in (SOCKET, PID_FILE):
            try:
                (self.pipe / name).unlink()
            except FileNotFoundError:
                pass
        self.log("Exit")


def _read_verdict(fd: int, timeout: float = 10.0) -> str:
    """The server's start-up verdict: "1", or "0" and why; "" if it exited without one."""
    import select
    data = b""
    try:
        while select.select([fd], [], [], timeout)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return data.decode(errors="replace")


def _percentage(value: str) -> float:
    number = float(value)
    if not 0 < number <= 100:
        raise ValueError(value)
    return number
