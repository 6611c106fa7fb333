"""Running the host's own programs (package managers, modprobe, systemctl) for the driver
installer, inside the host root.

On ``/`` a program runs as it is. In another root (a host mounted at ``/host`` in a
container, a Debian root built for tests) it runs through ``chroot`` so it sees that
root's files, package database and configuration. A simulated node's driver tools
(``nvidia-smi``, ``modprobe``, ...) are the simulator's programs, which run on this machine
against the node's files: its platform (``hostagent.platform``) runs them directly.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from ..errors import HostagentError, NotFoundError
from ..hostroot import HostRoot

__all__ = ["Runner", "CommandFailed", "Result"]

PATH_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
# Programs that act on the running kernel: chrooted into a root that is not this machine's
# (a simulated node's), they would still load modules into this machine's kernel.
KERNEL_TOOLS = ("modprobe", "rmmod", "insmod", "nvidia-modprobe")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C",
       "DEBIAN_FRONTEND": "noninteractive", "APT_LISTCHANGES_FRONTEND": "none"}


class CommandFailed(HostagentError):
    code = "command_failed"


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    code: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    def last_line(self) -> str:
        lines = [line for line in (self.err or self.out).splitlines() if line.strip()]
        return lines[-1].strip() if lines else f"exit status {self.code}"


class Runner:
    def __init__(self, host: HostRoot, *, timeout: float = 1800):
        self.host = host
        self.timeout = timeout

    def find(self, program: str) -> str | None:
        """The program's path as the host sees it, or None."""
        for rel in PATH_DIRS:
            path = self.host.host(f"/{rel}/{program}")
            if os.access(path, os.X_OK) and path.is_file():
                return f"/{rel}/{program}"
        return None

    def has(self, program: str) -> bool:
        return self.find(program) is not None

    def argv(self, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` in the host root."""
        program = argv[0]
        found = self.find(program)
        if found is None:
            raise NotFoundError(f"{program} not found on the host", where=str(self.host.root),
                                hint=f"install it (it is looked for in /{', /'.join(PATH_DIRS)})")
        if self.host.root == self.host.root.parent:            # "/"
            return [found, *argv[1:]]
        own = self.host.platform.command(self.host, program, found)     # a simulator's stand-in
        if own is not None:
            return [*own, *argv[1:]]
        return ["chroot", str(self.host.root), found, *argv[1:]]

    def run(self, argv: list[str], *, check: bool = True, input: str | None = None) -> Result:
        cmd = self.argv(argv)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, input=input, env=ENV,
                                  timeout=self.timeout, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise CommandFailed(f"{' '.join(argv)} did not finish in {self.timeout:g} s") from None
        result = Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and not result.ok:
            raise CommandFailed(f"{' '.join(argv)} failed: {result.last_line()}", exit_code=result.code)
        return result
