"""A device's health as the API reports it.

Until the health monitor feeds the daemon, every device is ``unmonitored``: never silently
healthy. The states are the health package's (``DeviceHealth.state``): healthy, unhealthy,
unmonitored. A monitor replaces records through ``Agent.set_health`` (on the event loop's
thread; from another thread through ``loop.call_soon_threadsafe``); the API, the watch
stream and allocation checks read them from there.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

__all__ = ["Health", "STATES", "unmonitored"]

STATES = ("healthy", "unhealthy", "unmonitored")


@dataclass(frozen=True)
class Health:
    state: str            # one of STATES
    reason: str           # "unmonitored", later "xid", "ecc_dbe", "gpu_lost", "recovered", ...
    message: str
    since: float          # when the state began (unix time)

    @property
    def allocatable(self) -> bool:
        return self.state != "unhealthy"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["since"] = round(self.since, 3)
        return out


def unmonitored(now: float | None = None) -> Health:
    return Health("unmonitored", "unmonitored", "health monitoring is not running",
                  time.time() if now is None else now)
