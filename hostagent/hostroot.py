"""Every host path hostagent touches is resolved through one HostRoot.

In production the root is ``/``; in tests and on a simulated node it is a directory that
holds a whole host tree (dev, proc, sys, etc, run, var, driver files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostRoot", "SIMULATE_ENV"]

SIMULATE_ENV = "HOSTAGENT_SIMULATE"


@dataclass(frozen=True)
class HostRoot:
    root: Path = Path("/")
    driver_root: Path | None = None   # where driver libraries and binaries live; default: root
    dev_root: Path | None = None      # where /dev lives; default: root
    simulated: bool = False

    def __post_init__(self):
        for name in ("root", "driver_root", "dev_root"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    @classmethod
    def simulation(cls, directory: str | os.PathLike) -> "HostRoot":
        return cls(root=Path(directory).absolute(), simulated=True)

    @classmethod
    def from_env(cls, simulate: str | None = None) -> "HostRoot":
        simulate = simulate or os.environ.get(SIMULATE_ENV)
        return cls.simulation(simulate) if simulate else cls()

    def host(self, path: str | os.PathLike) -> Path:
        """A host path (absolute as seen on the host) inside this root."""
        return self.root / str(path).lstrip("/")

    def driver(self, path: str | os.PathLike = "") -> Path:
        return (self.driver_root or self.root) / str(path).lstrip("/")

    def dev(self, path: str | os.PathLike = "") -> Path:
        return (self.dev_root or self.root) / "dev" / str(path).lstrip("/")

    def driver_tool(self, name: str) -> Path | None:
        """One of the driver's programs (nvidia-smi, nvidia-cuda-mps-control): in the driver
        root's usr/bin, or on PATH on a real host whose driver root is /; None if missing."""
        path = self.driver("usr/bin") / name
        if path.is_file():
            return path
        if not self.simulated and str(self.driver()) == "/":
            import shutil
            found = shutil.which(name)
            if found:
                return Path(found)
        return None

    def proc(self, path: str | os.PathLike = "") -> Path:
        return self.root / "proc" / str(path).lstrip("/")

    def sys(self, path: str | os.PathLike = "") -> Path:
        return self.root / "sys" / str(path).lstrip("/")

    @property
    def state_dir(self) -> Path:
        return self.host("/var/lib/hostagent")

    @property
    def run_dir(self) -> Path:
        return self.host("/run/hostagent")

    @property
    def cdi_dir(self) -> Path:
        return self.host("/var/run/cdi")

    @property
    def config_file(self) -> Path:
        return self.host("/etc/hostagent/config.yaml")
