"""The monitor's published view: ``/run/hostagent/health.json``, replaced atomically on
every change, so ``hostagent health status`` (and anything else on the node) can read health
without the daemon's API. It is a view, not a store: a monitor starts from its own state."""

from __future__ import annotations

import json
import os
import time

from ..errors import UnavailableError
from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot
from .records import DeviceHealth, Reason
from .state import HealthState

__all__ = ["STATE_FILE", "write_state", "read_state", "PublishedState", "state_from_dict"]

STATE_FILE = "health.json"


def _path(host: HostRoot):
    return host.run_dir / STATE_FILE


def write_state(host: HostRoot, state: HealthState, *, policy: str, quiet_period: float | None) -> None:
    doc = {"pid": os.getpid(), "written_at": time.time(), "policy": policy,
           "quiet_period": quiet_period, **state.to_dict()}
    ensure_dir(host.run_dir)
    # /run is memory: atomicity matters to readers, durability does not.
    write_atomic(_path(host), json.dumps(doc, separators=(",", ":")), durable=False)


def state_from_dict(doc: dict, revision: int | None = None) -> HealthState:
    """A ``HealthState`` back from ``HealthState.to_dict()`` (the state file, ``GET /v1/health``)."""
    devices = {}
    for raw in doc["devices"]:
        raw = {k: v for k, v in raw.items() if k != "state"}
        raw["reasons"] = tuple(Reason(**r) for r in raw["reasons"])
        raw["notice"] = Reason(**raw["notice"]) if raw.get("notice") else None
        devices[raw["key"]] = DeviceHealth(**raw)
    return HealthState(devices, doc["revision"] if revision is None else revision)


class PublishedState:
    def __init__(self, doc: dict):
        self.doc = doc
        self.pid: int = doc["pid"]
        self.written_at: float = doc["written_at"]
        self.state = state_from_dict(doc)

    @property
    def writer_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def read_state(host: HostRoot) -> PublishedState:
    path = _path(host)
    try:
        return PublishedState(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UnavailableError("no health monitor has published state", where=str(path),
                               hint="health is watched by the daemon; without it run "
                                    "'hostagent health watch'") from None
