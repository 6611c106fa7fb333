"""``nvidia-persistenced`` stand-in.

Reproduced behaviour (options as NVIDIA's nvidia-persistenced source defines them):

* ``-v``/``--version`` prints the version banner (``nvidia-persistenced:  version
  <driver version>``, from the node's facts) and exits 0; ``-h``/``--help`` prints usage.
* ``-V``/``--verbose``, ``-u``/``--user USER``, ``-g``/``--group GROUP``,
  ``--[no-]persistence-mode``, ``--[no-]uvm-persistence-mode``, ``--nvidia-cfg-path PATH``
  and ``-f``/``--foreground`` are accepted. An unknown user fails with ``Failed to find
  user ID of user 'x': ...`` (exit 1); an invalid command line prints the real message
  and, as the real tool does, exits 0.
* Unless ``--foreground``, the daemon forks and detaches (setsid, stdio on /dev/null);
  the foreground process waits for its start-up verdict and exits 0, or prints
  "nvidia-persistenced failed to initialize. Check syslog for more details." and exits 1.
* The daemon takes a lock on ``<root>/var/run/nvidia-persistenced/nvidia-persistenced.pid``
  (so a second instance fails to initialise) and writes its pid there, fails when the
  driver is not loaded, replaces ``<root>/run/nvidia-persistenced/socket`` with a
  listening UNIX socket, and on SIGTERM/SIGINT closes and unlinks the socket and the pid
  file and exits 0.
* Syslog lines (``Started (pid)``, ``Shutdown (pid)``, errors) go to
  ``<root>/var/log/nvidia-persistenced.log``.

* At its start it holds every GPU the nvidia driver holds (persistence mode on for them,
  and their unbindLock refused) until ``nvidia-smi -pm 0`` lets one go; a GPU probed after
  its start (bound back from vfio-pci) it does not take.

Not reproduced: the daemon does not drop privileges to ``--user``; it does not speak the
RPC protocol on its socket (``nvidia-smi -pm`` changes the node's state directly).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .. import unixsock
from . import detach, init_done, wait_init

__all__ = ["main"]

PID_FILE = "var/run/nvidia-persistenced/nvidia-persistenced.pid"
SOCKET = "run/nvidia-persistenced/socket"
LOG_FILE = "var/log/nvidia-persistenced.log"

FLAGS = {"-v": "version", "--version": "version", "-h": "help", "--help": "help",
         "-V": "verbose", "--verbose": "verbose", "-f": "foreground", "--foreground": "foreground",
         "--persistence-mode": "persistence", "--no-persistence-mode": "no_persistence",
         "--uvm-persistence-mode": "uvm", "--no-uvm-persistence-mode": "no_uvm"}
VALUES = {"-u": "user", "--user": "user", "-g": "group", "--group": "group",
          "--nvidia-cfg-path": "cfg_path"}


def _facts(root: str) -> dict:
    import json
    return json.loads((Path(root) / ".sim/node.json").read_text())


def _banner(root: str) -> str:
    return (f"\nnvidia-persistenced:  version {_facts(root)['driver_version']}\n\n"
            "  The NVIDIA Persistence Daemon.\n\n"
            "  A tool for maintaining persistent driver state, specifically for use by the "
            "NVIDIA Linux driver.\n\n  Copyright (C) 2013-2016 NVIDIA Corporation.\n")


def _parse(argv: list[str]) -> dict | None:
    opts: dict = {}
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=") if argv[i].startswith("--") else (argv[i], "", "")
        if name in FLAGS and not eq:
            opts[FLAGS[name]] = True
        elif name in VALUES:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                value = argv[i]
            opts[VALUES[name]] = value
        else:
            return None
        i += 1
    return opts


def main(root: str, argv: list[str]) -> int:
    opts = _parse(argv)
    if opts is None:
        print("ERROR: Invalid commandline, please run `nvidia-persistenced --help` for usage "
              "information.", file=sys.stderr)
        return 0
    if opts.get("version"):
        print(_banner(root))
        return 0
    if opts.get("help"):
        print(_banner(root) + "\nnvidia-persistenced [options]\n\n  -v, --version\n  -h, --help\n"
              "  -V, --verbose\n  -u USERNAME, --user=USERNAME\n  -g GROUPNAME, --group=GROUPNAME\n"
              "  --persistence-mode, --no-persistence-mode\n"
              "  --uvm-persistence-mode, --no-uvm-persistence-mode\n"
              "  --nvidia-cfg-path=PATH\n  -f, --foreground\n")
        return 0
    for key, lookup in (("user", "getpwnam"), ("group", "getgrnam")):
        if key in opts:
            import grp
            import pwd
            try:
                getattr(pwd if key == "user" else grp, lookup)(opts[key])
            except KeyError:
                print(f"ERROR: Failed to find {key} ID of {key} '{opts[key]}': No such file or directory",
                      file=sys.stderr)
                return 1
    if not opts.get("foreground"):
        fd = detach(double_fork=False)
        if fd is not None:
            if wait_init(fd):
                return 0
            print("nvidia-persistenced failed to initialize. Check syslog for more details.",
                  file=sys.stderr)
            return 1
    return Daemon(Path(root), verbose=bool(opts.get("verbose"))).run()


class Daemon:
    def __init__(self, root: Path, verbose: bool):
        self.root, self.verbose = root, verbose

    def _hold_gpus(self) -> None:
        """At its start the daemon opens every GPU the nvidia driver holds (and keeps them
        open: persistence mode); one bound later it does not take."""
        from ..store import SimStore
        with SimStore(self.root).mutate() as state:
            for gpu in state.nvml_gpus():
                gpu.persistenced_released = False

    def syslog(self, message: str, *, verbose_only: bool = False) -> None:
        if verbose_only and not self.verbose:
            return
        try:
            path = self.root / LOG_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{time.strftime('%b %d %H:%M:%S')} nvidia-persistenced[{os.getpid()}]: {message}\n")
        except OSError:
            pass

    def run(self) -> int:
        import fcntl
        import select
        import signal
        import socket

        pid_path, sock_path = self.root / PID_FILE, self.root / SOCKET
        pid_path.parent.mkdir(parents=True, exist_ok=True)
        pid_fd = os.open(pid_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(pid_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self.syslog(f"Failed to lock PID file: {e.strerror}")
            os.close(pid_fd)
            init_done(False)
            return 1
        os.ftruncate(pid_fd, 0)
        os.write(pid_fd, f"{os.getpid()}\n".encode())
        self.syslog(f"Started ({os.getpid()})")
        sock = None
        try:
            try:
                loaded = _facts(str(self.root)) and _driver_loaded(self.root)
            except (OSError, ValueError):
                loaded = False
            if not loaded:
                self.syslog("Failed to query NVIDIA devices. Please ensure that the NVIDIA device "
                            "files (/dev/nvidia*) exist, and that user %d has read and write "
                            "permissions for those files." % os.getuid())
                init_done(False)
                return 1
            sock_path.parent.mkdir(parents=True, exist_ok=True)
            if sock_path.exists() or sock_path.is_symlink():
                sock_path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unixsock.bind(sock, sock_path)
            sock.listen(16)
            self.syslog("Local RPC services initialized", verbose_only=True)
            stopping = []
            wake_r, wake_w = os.pipe()
            os.set_blocking(wake_w, False)
            signal.set_wakeup_fd(wake_w)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stopping.append(True))
            self._hold_gpus()
            init_done(True)
            while not stopping:
                ready, _, _ = select.select([sock, wake_r], [], [], 5)
                if sock in ready:
                    try:
                        conn, _ = sock.accept()
                        conn.close()      # no RPC: the socket only has to be there and listen
                    except OSError:
                        pass
            return 0
        finally:
            if sock is not None:
                sock.close()
                self.syslog("Socket closed.", verbose_only=True)
                try:
                    sock_path.unlink()
                except FileNotFoundError:
                    pass
            try:
                pid_path.unlink()
            except FileNotFoundError:
                pass
            os.close(pid_fd)
            self.syslog(f"Shutdown ({os.getpid()})")


def _driver_loaded(root: Path) -> bool:
    import json
    return bool(json.loads((root / ".sim/state.json").read_text()).get("driver_loaded", True))
