"""Every host path hostagent touches is resolved through one HostRoot.

In production the root is ``/``. Elsewhere it is a directory that holds a whole host tree
(dev, proc, sys, etc, run, var, driver files), in one of two ways:

- a simulated node (``--simulate DIR``): its files are on this machine, and paths written
  for engines (CDI specs, configs) are this machine's, root included; its ``platform`` is
  the simulator's (``hostagent.platform``: its NVML, its tools, no engines to restart);
- a host's ``/`` mounted in a container (``--host-root DIR``, a DaemonSet's ``/host``):
  paths written for the host's engines are the host's, the root removed (``on_host``).

Symlinks inside the root resolve as the host would resolve them: an absolute target
starts again at the root (a Debian root's ``/var/run -> /run``), never at this machine's
``/``, and ``..`` stops at the root. A driver root (the GPU operator's driver container at
``/run/nvidia/driver``) is a root of its own for the files beneath it.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from .platform import HOST, Platform

__all__ = ["HostRoot", "SIMULATE_ENV", "HOST_ROOT_ENV", "DRIVER_ROOT_ENV", "CONFIG_ENV", "LIBRARY_DIRS",
           "resolve_within"]

SIMULATE_ENV = "HOSTAGENT_SIMULATE"
HOST_ROOT_ENV = "HOSTAGENT_HOST_ROOT"
DRIVER_ROOT_ENV = "HOSTAGENT_DRIVER_ROOT"
CONFIG_ENV = "HOSTAGENT_CONFIG"
_MAX_LINKS = 40          # as the kernel's ELOOP limit
# Where a driver root keeps the driver's libraries (Debian's multiarch, EL's lib64, the
# driver packages' nvidia/current), relative to it.
LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu",
                "usr/lib/x86_64-linux-gnu/nvidia/current", "usr/lib/aarch64-linux-gnu/nvidia/current",
                "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")


def resolve_within(root: Path, path: str | os.PathLike) -> Path:
    """``path`` (absolute as seen inside ``root``) under ``root``, every symlink on the way
    followed as a process chrooted to ``root`` would; what does not exist is kept as named
    (a file about to be written)."""
    todo = [p for p in str(path).split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while todo:
        name = todo.pop(0)
        if name == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, name)
        try:
            target = os.readlink(here)
        except OSError:                # not a link, or missing: taken as it is
            done.append(name)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(here))
        if target.startswith("/"):
            done = []
        todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
    return root.joinpath(*done)


@dataclass(frozen=True)
class HostRoot:
    root: Path = Path("/")
    driver_root: Path | None = None   # where driver libraries and binaries live; default: root
    dev_root: Path | None = None      # where /dev lives; default: root
    # What differs on a simulated node (hostagent.platform); HOST on a real one.
    platform: Platform = field(default=HOST, repr=False)
    mounted: bool = False             # root is a host's / mounted here: see on_host
    # The agent's configuration file on this machine when it is not the host's
    # /etc/hostagent/config.yaml: a DaemonSet's ConfigMap (HOSTAGENT_CONFIG).
    config: Path | None = None

    def __post_init__(self):
        for name in ("root", "driver_root", "dev_root", "config"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    @property
    def simulated(self) -> bool:
        return self.platform.simulated

    @classmethod
    def simulation(cls, directory: str | os.PathLike, platform: Platform) -> "HostRoot":
        """The simulated node at ``directory``, run by ``platform`` (the simulator's)."""
        return cls(root=Path(directory).absolute(), platform=platform)

    @classmethod
    def mounted_at(cls, directory: str | os.PathLike, driver_root: str | None = None, *,
                   platform: Platform = HOST) -> "HostRoot":
        """The host whose ``/`` is mounted at ``directory``; ``driver_root`` is a path on
        that host (``/run/nvidia/driver``)."""
        root = Path(directory).absolute()
        driver = resolve_within(root, driver_root) if driver_root and driver_root.strip("/") else None
        return cls(root=root, driver_root=driver, platform=platform, mounted=True)

    @classmethod
    def from_env(cls, simulate: str | None = None, host_root: str | None = None,
                 driver_root: str | None = None, *, simulator=None) -> "HostRoot":
        """The host the options (else HOSTAGENT_SIMULATE, HOSTAGENT_HOST_ROOT,
        HOSTAGENT_DRIVER_ROOT) name, with the configuration file HOSTAGENT_CONFIG names.
        ``--simulate DIR --host-root DIR`` is a simulated node seen as a mounted host (its
        tree at DIR in a container). ``simulator``: a function that returns the simulator's
        platform, called only for a simulated node (the composition roots pass it)."""
        import dataclasses
        host = cls._from_options(simulate, host_root, driver_root, simulator)
        config = os.environ.get(CONFIG_ENV)
        return dataclasses.replace(host, config=Path(config).absolute()) if config else host

    @classmethod
    def _from_options(cls, simulate: str | None, host_root: str | None, driver_root: str | None,
                      simulator) -> "HostRoot":
        from .errors import UsageError
        simulate = simulate or os.environ.get(SIMULATE_ENV) or None
        host_root = host_root or os.environ.get(HOST_ROOT_ENV) or None
        driver_root = driver_root or os.environ.get(DRIVER_ROOT_ENV) or None
        platform = HOST
        if simulate:
            if simulator is None:
                raise UsageError(f"this program cannot run a simulated node (--simulate {simulate}, or "
                                 f"{SIMULATE_ENV})", hint="use hostagent or hostagentd with --simulate")
            platform = simulator()
        if host_root:
            if simulate and Path(simulate).absolute() != Path(host_root).absolute():
                raise UsageError(f"--simulate {simulate} and --host-root {host_root} name different roots",
                                 hint="a simulated node seen as a mounted host is given as the same "
                                      "directory to both")
            return cls.mounted_at(host_root, driver_root, platform=platform)
        host = cls.simulation(simulate, platform) if simulate else cls()
        if driver_root:          # on this machine (a simulated node's driver files elsewhere)
            return cls(root=host.root, driver_root=Path(driver_root).absolute(), platform=platform)
        return host

    # ---- host paths -> paths on this machine ------------------------------------------

    def _under(self, root: Path, path) -> Path:
        if root == root.parent:               # "/": this machine is the host
            return root / str(path).lstrip("/")
        return resolve_within(root, path)

    def host(self, path: str | os.PathLike) -> Path:
        """A host path (absolute as seen on the host) inside this root."""
        return self._under(self.root, path)

    def driver(self, path: str | os.PathLike = "") -> Path:
        return self._under(self.driver_root or self.root, path)

    def dev(self, path: str | os.PathLike = "") -> Path:
        return self._under(self.dev_root or self.root, f"dev/{str(path).lstrip('/')}")

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

    def driver_command(self, name: str) -> list[str] | None:
        """The command line that runs the driver's program ``name`` as the host would: on a
        mounted host in its driver root (chroot: the program needs the host's libraries,
        not this container's); else the program itself. None if missing."""
        path = self.driver_tool(name)
        if path is None:
            return None
        if self.mounted and not self.simulated:
            return ["chroot", str(self.driver_root or self.root), "/" + path.relative_to(self.driver()).as_posix()]
        return [str(path)]

    def proc(self, path: str | os.PathLike = "") -> Path:
        return self.host(f"proc/{str(path).lstrip('/')}")

    def sys(self, path: str | os.PathLike = "") -> Path:
        return self.host(f"sys/{str(path).lstrip('/')}")

    def resolve(self, path: str | os.PathLike) -> Path:
        """A path on this machine inside the root (or the driver root), its symlinks followed
        within that root: where a library's or binary's links lead on the host."""
        path = Path(path)
        for root in (self.driver_root, self.root):
            if root is not None and (path == root or root in path.parents):
                return self._under(root, path.relative_to(root)) if root != root.parent else path.resolve()
        return path.resolve()

    # ---- paths on this machine -> what the host's programs are told -------------------

    def on_host(self, path: str | os.PathLike) -> str:
        """The path the host's engines and tools know ``path`` (on this machine) by: the
        root removed for a mounted host; unchanged otherwise (a simulated node's files are
        on this machine)."""
        if not self.mounted:
            return str(path)
        try:
            rel = Path(path).relative_to(self.root).as_posix()
        except ValueError:
            from .errors import StateError
            raise StateError(f"{path} is not on the host (not under its root {self.root})",
                             hint="mount the host's files beneath the host root") from None
        return "/" if rel == "." else "/" + rel

    def shown(self, path: str | os.PathLike) -> str:
        """A path as it is on the host, for messages (a simulated node's directory left out)."""
        try:
            rel = Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return str(path)
        return "/" if rel == "." else "/" + rel

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
        return self.config or self.host("/etc/hostagent/config.yaml")
