"""A device's health as the API reports it.

Until health monitoring runs (it arrives with NVML event handling), every device is
``unknown`` with reason ``unmonitored``: never silently healthy. The monitor will replace
records through ``Agent.set_health``; the API, the watch stream and allocation checks
already read them from here.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

__all__ = ["Health", "STATES", "unmonitored"]

STATES = ("healthy", "unhealthy", "unknown")


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
    return Health("unknown", "unmonitored", "health monitoring is not running",
                  time.time() if now is None else now)
