"""The simulator's side of the seam (``hostagent.platform``): a simulated node's NVML, its
driver tools and its (absent) container engines.

``SIMULATOR`` is what the composition roots give a node named by ``--simulate``;
``simulated_host(DIR)`` is that node's ``HostRoot``, for the simulator's own commands and
for tests.
"""

from __future__ import annotations

import os
import threading

from ..hostroot import HostRoot
from ..platform import Platform

__all__ = ["SimulatedNode", "SIMULATOR", "simulated_host", "simulator"]

# What driverroot writes into every stand-in, to tell it from a root's own program.
STAND_IN_MARK = b"backed by the simulated node"

_lock = threading.Lock()


class SimulatedNode(Platform):
    simulated = True

    def load_nvml(self, host) -> bool:
        import pynvml as N
        with _lock:
            # Whatever library is beneath pynvml now (another node's fake included) is the one
            # to check: anyone may have installed one since this process last did.
            lib = N.nvmlLib
            if getattr(lib, "store", None) is None or lib.store.root != host.root:
                from . import fakenvml
                lib = fakenvml.install(host.root)
                lib.store.check()
        # A node whose files are unreadable is reported as such, naming the file, rather than
        # as a vague nvmlInit failure (cheap: the state is cached until it changes).
        lib.store.facts
        lib.store.read()
        return True

    def command(self, host, program: str, path: str) -> list[str] | None:
        """The simulator's stand-ins run as they are (they find their node by their path); a
        kernel tool the node lacks is refused, not chrooted (it would act on this machine)."""
        from ..driver.system import KERNEL_TOOLS
        from ..errors import HostagentError
        from .driverroot import TOOLS
        if program in TOOLS and _stand_in(host.host(path)):
            return [str(host.host(path))]
        if program in KERNEL_TOOLS:
            raise HostagentError(f"the simulated node has no {program} of its own", where=path,
                                 hint="recreate the node with this version of hostagent")
        return None

    def restart_engine(self, host, engine: str, service: str) -> str | None:
        from .store import SimStore
        if not SimStore(host.root).exists():
            return None
        # No engine runs on a simulated node, and the host's own must not be touched.
        return f"simulated node: no {engine} to restart (a real node's {service} would be restarted here)"

    def pause(self, seconds: float) -> None:
        """No wait: the simulated kernel acts on each write at once, so asking again at once
        sees whatever has changed meanwhile."""

    def write_attribute(self, host, path: str, value: str) -> None:
        """The simulated kernel acts on the write (sim/pcibus.py)."""
        from . import pcibus
        from .store import SimStore
        pcibus.write(SimStore(host.root), str(path).lstrip("/"), value)

    def char_device(self, host, path):
        """A real device node as the host's; a regular file the simulator wrote in its place
        (the node was made by a user who may not create device nodes) as the device it
        records, so such a node's CDI spec and allocations are root's."""
        found = super().char_device(host, path)
        if found is not None:
            return found
        from .files import recorded_char_device
        return recorded_char_device(path)

    def is_node(self, host) -> bool:
        from .store import SimStore
        return SimStore(host.root).exists()

    def require_node(self, host) -> None:
        from .store import SimStore
        SimStore(host.root).check()


def _stand_in(path) -> bool:
    try:
        with open(path, "rb") as f:
            return STAND_IN_MARK in f.read(512)
    except OSError:
        return False


SIMULATOR = SimulatedNode()


def simulated_host(directory: str | os.PathLike) -> HostRoot:
    """The simulated node at ``directory``, run by the simulator."""
    return HostRoot.simulation(directory, SIMULATOR)


def simulator() -> SimulatedNode:
    """For ``HostRoot.from_env(simulator=...)``."""
    return SIMULATOR
