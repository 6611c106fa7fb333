"""One narrow interface over the container engines' configuration files.

An engine is built from what it reads (through a ``files.Reader``: file texts and glob
matches by host path) and knows where it writes (its destinations); it edits an in-memory
document through four operations and renders the text of every destination. It never
writes: ``files`` does, so ``--dry-run`` prints a diff of the same rendering that a real
run writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Engine", "Settings", "configure", "DEFAULT_CDI_DIRS"]

DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")   # what the engines use when not told


@dataclass(frozen=True)
class Settings:
    runtime_name: str = "hostagent"
    binary: str = "/usr/local/sbin/hostagent-runtime"
    set_as_default: bool = False
    cdi: bool = False
    cdi_spec_dirs: tuple[str, ...] = DEFAULT_CDI_DIRS


class Engine(Protocol):
    name: str                      # containerd, crio, docker
    drop_in: str | None            # the drop-in it writes (None: the main file)
    notes: list[str]               # what the user should know about the result

    def add_runtime(self, name: str, binary: str) -> None:
        """Add (or replace) the runtime ``name`` that runs ``binary``."""

    def set_default(self, name: str, enable: bool) -> None:
        """Make ``name`` the default runtime, or (``enable=False``) stop it being one."""

    def enable_cdi(self, spec_dirs: tuple[str, ...]) -> None:
        """Turn on the engine's own CDI support, reading ``spec_dirs``."""

    def render(self) -> dict[str, str | None]:
        """Host path -> new text of every destination (None: the file should not exist)."""


def configure(engine: Engine, settings: Settings) -> dict[str, str | None]:
    engine.add_runtime(settings.runtime_name, settings.binary)
    engine.set_default(settings.runtime_name, settings.set_as_default)
    if settings.cdi:
        engine.enable_cdi(settings.cdi_spec_dirs)
    return engine.render()
