"""Impostors of an MPS control daemon: processes of another user (nobody, in no group) that
look like one from outside, running the node's control binary with ``-d`` and a daemon's
pipe directory in their environment, as any local user can start them.

The binary is executed through a descriptor root opened (this checkout's interpreter may
sit in a folder nobody can search), and each impostor is held just after its ``execve``
(``PTRACE_TRACEME``: the kernel stops it there, and it never runs a line): its executable,
command line and environment are the impostor's for as long as the test wants, and a
signal anyone sends it stays pending there (SIGKILL ends it), so the test sees whether the
agent signalled it.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

from hostagent.processes import program

__all__ = ["Impostors", "NOBODY"]

NOBODY = 65534
_PTRACE_TRACEME, _PTRACE_CONT = 0, 7


class Impostors:
    """``held`` impostors, stopped at their exec; ``loop()`` starts a loop of short-lived ones
    (each runs its exec and ends) for as long as the block runs."""

    def __init__(self, control: str, pipe: Path, env: dict | None = None):
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), **(env or {})}
        self.control = control
        self.prog = program(control)
        self.pipe = pipe
        self.held: list[int] = []
        self.dead: set[int] = set()        # held ones that died (reaped)
        self._loop: int | None = None

    def _argv(self) -> tuple[str, list[str]]:
        """(the executable, argv) as the control program runs: a ``#!`` script's interpreter
        with the script among its arguments."""
        if self.prog.script is None:
            return self.control, [self.control, "-d"]
        with open(self.control, "rb") as f:
            interpreter, *flags = f.readline()[2:].decode().split()
        return interpreter, [interpreter, *flags, self.control, "-d"]

    def _spawn(self, traced: bool) -> int:
        exe, argv = self._argv()
        fd = os.open(exe, os.O_RDONLY | os.O_CLOEXEC)
        env = self.env
        pid = os.fork()
        if pid == 0:
            try:
                null = os.open(os.devnull, os.O_RDWR)
                for std in (0, 1, 2):
                    os.dup2(null, std)
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                if traced:
                    ctypes.CDLL(None, use_errno=True).ptrace(_PTRACE_TRACEME, 0, None, None)
                os.execve(fd, argv, env)
            finally:
                os._exit(127)
        os.close(fd)
        return pid

    def hold(self, count: int = 1) -> list[int]:
        """``count`` impostors, each stopped at its exec (they look like daemons from now on)."""
        pids = [self._spawn(traced=True) for _ in range(count)]
        for pid in pids:
            _, status = os.waitpid(pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP, status
        self.held += pids
        return pids

    def signalled(self) -> list[tuple[int, int]]:
        """(pid, signal) of every signal someone sent a held impostor (its death: -1). A
        stopped tracee keeps the signals sent to it pending, where /proc shows them."""
        out = []
        for pid in self.held:
            if pid in self.dead or os.waitpid(pid, os.WNOHANG)[0]:
                self.dead.add(pid)
                out.append((pid, -1))
                continue
            pending = 0
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(("SigPnd:", "ShdPnd:")):
                    pending |= int(line.split()[1], 16)
            out += [(pid, n) for n in range(1, 65) if pending & (1 << (n - 1))]
        return out

    def loop(self) -> None:
        """A process that starts an impostor, reaps it, and starts the next, until ``close``."""
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
                while True:
                    child = self._spawn(traced=False)
                    os.waitpid(child, 0)
            finally:
                os._exit(0)
        self._loop = pid

    def close(self) -> None:
        if self._loop is not None:
            os.kill(self._loop, signal.SIGTERM)
            os.waitpid(self._loop, 0)
            self._loop = None
        for pid in self.held:
            if pid not in self.dead:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        self.held, self.dead = [], set()

    def __enter__(self) -> "Impostors":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
