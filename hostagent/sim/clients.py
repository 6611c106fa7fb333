"""Driver clients of a simulated node: programs that keep the GPUs' device files open
without being CUDA processes, so they block the GPU reset an Ampere MIG mode change needs
(MIG user guide, "Driver Clients"; mig.md 1.5) yet appear in no process list."""

from __future__ import annotations

from pathlib import Path

from ..fileio import pid_alive
from .tools import read_pid
from .tools.persistenced import PID_FILE

__all__ = ["driver_clients"]


def driver_clients(root: str | Path) -> tuple[str, ...]:
    """The driver clients running on the node: ``nvidia-persistenced`` while its stand-in runs."""
    pid = read_pid(Path(root) / PID_FILE)
    return ("nvidia-persistenced",) if pid is not None and pid_alive(pid) else ()
