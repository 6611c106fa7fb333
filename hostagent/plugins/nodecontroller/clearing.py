"""Devices in use cleared for a change (``--on-busy evict``): the node cordoned, the pods
holding the devices evicted, then, once the change is made or given up, the cordon lifted if
it was this feature's. Used by MIG by label and sharing by label alike."""

from __future__ import annotations

import logging
import time

from ...errors import HostagentError
from .events import NORMAL, WARNING
from .evict import Refused, ended_patch, started, started_patch
from .holders import holders

__all__ = ["Clearing"]

log = logging.getLogger("hostagent.plugins")


class Clearing:
    """Devices in use cleared for one feature (``why``: the label it serves): the node
    cordoned, the pods holding them evicted, then, once the agent's allocations are gone and
    the change made (or given up), the cordon lifted if it was this feature's.

    What it did is on the Node, not in this process: the cordon (``hostagent.io/cordoned-by``)
    and when the evictions began (``hostagent.io/<why>.eviction-started``). A controller
    restarted mid-way goes on with the evictions and the time left of ``--eviction-timeout``,
    and lifts the cordon once the change is done."""

    def __init__(self, ctx, why: str):
        self.ctx = ctx
        self.why = why
        self.evicted_for: set | None = None     # the allocations this process evicted the pods of

    def started(self) -> float | None:
        return started(self.ctx.writer.node, self.why)

    @property
    def active(self) -> bool:
        return self.started() is not None or self.ctx.cordon.holds(self.why)

    def overdue(self) -> bool:
        began = self.started()
        return began is not None and time.time() >= began + self.ctx.options.eviction_timeout

    def due(self, ids: tuple) -> bool:
        """Whether the pods holding the allocations ``ids`` are still to be evicted by this
        process (it restarted, or other allocations are in the way since)."""
        return self.evicted_for is None or not set(ids) <= self.evicted_for

    def start(self, ids: tuple, busy, what: str) -> str | None:
        """Cordon and evict for the allocations ``ids`` (``busy``: those of them still there,
        the agent's ``{id, labels, devices}``), or go on evicting after a restart; the problem
        when some pod cannot be evicted or some allocation has no pod, else None."""
        ctx, now = self.ctx, time.time()
        self.evicted_for = (self.evicted_for or set()) | set(ids)
        if ctx.cordon.cordon(self.why, also=lambda node: started_patch(node, self.why, now)):
            ctx.recorder.record(NORMAL, "Cordoned", f"node cordoned for {what}")
        left = (self.started() or now) + ctx.options.eviction_timeout - now
        found = holders(list(busy), ctx.api.node_pods(ctx.options.node), ctx.holdings())
        if found.unheld:
            return (f"no pod holds allocation(s) {', '.join(found.unheld)} (release them: hostagent allocations "
                    "release ID)")
        try:
            ctx.evictor.evict(found.pods, left=left)
        except Refused as e:
            return None if ctx.stop.is_set() else e.message     # stopping is no failure: the next start goes on
        if found.pods:
            ctx.recorder.record(NORMAL, "Evicted", f"evicted for {what}: "
                                + ", ".join(f"{ns}/{name}" for ns, name in found.pods))
        return None

    def finish(self) -> None:
        """Lift this feature's cordon (never another's), and forget its evictions."""
        self.evicted_for = None
        try:
            if self.ctx.cordon.uncordon(self.why, also=lambda node: ended_patch(node, self.why)):
                self.ctx.recorder.record(NORMAL, "Uncordoned", f"node uncordoned after {self.why}")
        except HostagentError as e:
            log.warning("the node's cordon for %s was not lifted: %s", self.why, e.message)
            self.ctx.recorder.record(WARNING, "UncordonFailed", f"the cordon for {self.why} was not lifted: "
                                                                f"{e.message}")
