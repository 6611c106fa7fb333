"""``verify(host)``: read the driver's facts and judge them, as ``driver verify`` and the
daemon's readiness gate do."""

from __future__ import annotations

from ..hostroot import HostRoot
from .verdict import Verdict

__all__ = ["verify"]


def verify(host: HostRoot, ignored: tuple[str, ...] = ()) -> Verdict:
    from .checks import judge
    from .probe import probe
    return judge(probe(host), ignored)
