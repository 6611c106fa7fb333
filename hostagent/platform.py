"""Where a simulated node differs from a real host: the one seam the simulator plugs into.

A ``HostRoot`` carries its ``Platform``. Production code asks it three things and otherwise
treats every host alike:

- ``load_nvml(host)``: put the node's own NVML beneath pynvml (the simulator's fake one);
  False leaves it to the host's library.
- ``command(host, program, path)``: the command line that runs one of the root's programs
  on this machine (the simulator's stand-ins run as they are); None: chroot into the root.
- ``restart_engine(host, engine, service)``: what to say instead of restarting a container
  engine (a simulated node runs none); None: restart it.
- ``is_node(host)``, ``require_node(host)``: whether the root is a node, or refuse one that
  is not (a folder never made one by ``sim create``), before anything is written into it.
- ``char_device(host, path)``: the device numbers of the character device at ``path`` (a
  real host's from ``stat``; a simulated node made by a user who may not create device
  nodes has regular files there, and the simulator's records say which device each is).
- ``write_attribute(host, path, value)``: write a kernel attribute (sysfs, procfs: a driver's
  ``bind``, a device's ``driver_override``), whose write is an action of the kernel's; a real
  host writes the file in place (never through a temporary file: the kernel acts on the
  write), the simulator applies what its kernel would do. OSError as the write fails.
- ``pause(seconds)``: wait before asking the kernel again (the nvidia driver's unbind lock,
  refused while the GPU is held open); a real host sleeps, the simulated kernel, which acts
  on each write at once, is asked again at once.

``HOST`` is a real host's: it changes nothing. The composition roots (``cli/main.py``,
``daemon/main.py``) give a node named by ``--simulate`` the simulator's (``platform`` in the
simulator's package); no other production module imports the simulator.
"""

from __future__ import annotations

import os
import stat
import time
from typing import NamedTuple

__all__ = ["Platform", "HOST", "CharDevice"]


class CharDevice(NamedTuple):
    major: int
    minor: int
    mode: int           # the file's permission bits


class Platform:
    """A real host."""

    simulated = False

    def load_nvml(self, host) -> bool:
        return False

    def command(self, host, program: str, path: str) -> list[str] | None:
        return None

    def restart_engine(self, host, engine: str, service: str) -> str | None:
        return None

    def is_node(self, host) -> bool:
        """Whether ``host`` is a node of this platform's (a real host always is)."""
        return True

    def require_node(self, host) -> None:
        """Refuse a root that is not a node of this platform's, saying how to make one."""

    def char_device(self, host, path) -> CharDevice | None:
        """The character device at ``path`` (on this machine), or None when the file there
        is something else; OSError (FileNotFoundError) when there is nothing."""
        st = os.stat(path)
        if not stat.S_ISCHR(st.st_mode):
            return None
        return CharDevice(os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def write_attribute(self, host, path: str, value: str) -> None:
        """Write ``value`` to the kernel attribute ``path`` (a host path) in one write."""
        fd = os.open(host.host(path), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


HOST = Platform()
