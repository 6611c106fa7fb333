"""What the spec directories offer, as a container engine's CDI cache would see it."""

from __future__ import annotations

from dataclasses import dataclass

from ..hostroot import HostRoot
from .cache import load_cache

__all__ = ["SPEC_DIRS", "ListedDevice", "list_devices"]

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")   # later directories take priority


@dataclass(frozen=True)
class ListedDevice:
    name: str          # fully qualified: vendor/class=name
    spec: str          # the file an engine takes it from


def list_devices(host: HostRoot, dirs=SPEC_DIRS) -> tuple[list[ListedDevice], list[str]]:
    """The devices an engine would offer, and the problems (skipped files, conflicts) that
    hide others."""
    cache = load_cache([str(host.host(d)) for d in dirs])
    devices = [ListedDevice(d.name, d.path) for d in cache.devices.values()]
    return devices, list(cache.errors)
