"""A device's health as the API reports it.

A device without a record (before the health monitor has registered the GPUs, or with
``health.enabled: false``) is ``unmonitored``: never silently healthy. The states are the
health package's (``DeviceHealth.state``): healthy, unhealthy, unmonitored. The monitor's
records reach ``Agent.health`` through ``healthlink`` (on the event loop's thread); the API,
the watch stream and allocation checks read them from there.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

__all__ = ["Health", "STATES", "unmonitored", "api_health"]

STATES = ("healthy", "unhealthy", "unmonitored")


@dataclass(frozen=True)
class Health:
    state: str            # one of STATES
    reason: str           # "healthy", "unmonitored", or the latest problem: "xid", "ecc_dbe", "gpu_lost"
    message: str
    since: float          # when the state began (unix time)
    monitored: bool = True
    # What the device has now, oldest first, as (kind, xid, ignored, at): each problem that
    # makes it unhealthy, then an XID the policy ignores, within its quiet period.
    problems: tuple = ()

    @property
    def allocatable(self) -> bool:
        return self.state != "unhealthy"

    def to_dict(self) -> dict:
        return dict(self._as_dict)

    @functools.cached_property
    def _as_dict(self) -> dict:
        """Rendered once: every publish puts each device's health in its view."""
        out = asdict(self)
        out["since"] = round(self.since, 3)
        out["problems"] = [{"kind": kind, "xid": xid, **({"ignored": True} if ignored else {}), "at": round(at, 3)}
                           for kind, xid, ignored, at in self.problems]
        return out


def unmonitored(now: float | None = None) -> Health:
    return Health("unmonitored", "unmonitored", "health monitoring is not running",
                  time.time() if now is None else now, monitored=False)


def api_health(dev) -> Health:
    """A monitor record (``DeviceHealth``) as the API's ``Health``."""
    from ..health.view import describe
    reason, message = describe(dev)
    problems = tuple((r.kind, r.xid, False, r.at) for r in dev.reasons)
    if dev.notice is not None:
        problems += ((dev.notice.kind, dev.notice.xid, True, dev.notice.at),)
    return Health(dev.state, reason, message, dev.changed_at, dev.monitored, problems)
