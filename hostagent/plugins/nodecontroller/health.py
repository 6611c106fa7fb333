"""GPU faults the cluster can see, the executor: on its own thread (a MIG apply never delays
them), the agent's health events become Events on the Node, and the agent's view of the
devices the ``GPUUnhealthy`` condition (``nodes/status``) and, with ``--taint-unhealthy``,
the ``nvidia.com/gpu.unhealthy=true:NoSchedule`` taint (``healthplan`` decides).

Nothing is written while the agent is away: what the cluster was told stays until the
agent says otherwise. A write the API server refused is tried again with back-off.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from ..kubeerror import KubeError
from . import healthplan
from .events import NORMAL, WARNING, timestamp
from .keys import CONDITION, TAINT

__all__ = ["HealthReporter", "taint_patch"]

log = logging.getLogger("hostagent.plugins")


def taint_patch(node: dict, wanted: bool) -> dict | None:
    """The patch adding or removing the unhealthy taint (only ours: other taints stay)."""
    taints = list((node.get("spec") or {}).get("taints") or ())
    has = any(t.get("key") == TAINT for t in taints)
    if wanted and not has:
        return {"spec": {"taints": taints + [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]}}
    if not wanted and has:
        return {"spec": {"taints": [t for t in taints if t.get("key") != TAINT] or None}}
    return None


class HealthReporter:
    def __init__(self, ctx):
        self.ctx = ctx
        self.states: dict | None = None         # uuid -> health state, as last reported
        self.down: str | None = None            # the driver gate's reason, as last reported
        self.announced: set[str] = set()        # devices a fault Event named while unhealthy
        self.retry: float | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    # ---- feeding ------------------------------------------------------------------------

    def on_event(self, event: dict) -> None:
        if event.get("type") == "health_event":
            self._queue.put(event.get("event") or {})

    def wake(self, *_ignored) -> None:
        self._queue.put(None)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="node-health", daemon=True)
        self._thread.start()

    # ---- the thread -----------------------------------------------------------------------

    def run(self) -> None:
        delay = self.ctx.options.backoff[0]
        while not self.ctx.stop.is_set():
            try:
                item = self._queue.get(timeout=delay if self.retry else 1.0)
            except queue.Empty:
                if not self.retry:
                    continue
                item = None
            items = [item]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            for event in (i for i in items if i is not None):
                self._fault(event)
            try:
                self.reconcile()
                self.retry, delay = None, self.ctx.options.backoff[0]
            except KubeError as e:
                if not self.retry:
                    log.warning("GPU health not reported to the API server (%s); trying again", e.message)
                self.retry, delay = time.monotonic(), min(delay * 2, self.ctx.options.backoff[1])

    def _fault(self, event: dict) -> None:
        found = healthplan.fault_event(event)
        if found:
            self.ctx.recorder.record(*found)
            self.announced.update(event.get("devices") or ())

    def reconcile(self) -> None:
        view, node = self.ctx.link.view, self.ctx.writer.node
        if not view.connected or node is None:
            return
        devices = view.devices
        for event in healthplan.transitions(self.states or {}, devices, self.announced):
            self.ctx.recorder.record(*event)
        down = healthplan.driver_down(view.node)
        if down != self.down:
            if down:
                self.ctx.recorder.record(WARNING, healthplan.UNHEALTHY_REASON, f"every GPU: {down}")
            elif self.down:
                self.ctx.recorder.record(NORMAL, healthplan.HEALTHY_REASON, "the GPU driver is ready again")
        self.states = {u: (d.get("health") or {}).get("state") for u, d in devices.items()}
        self.down = down
        self.announced &= {u for u, s in self.states.items() if s == "unhealthy"}
        previous = next((c for c in (node.get("status") or {}).get("conditions") or ()
                         if c.get("type") == CONDITION), None)
        condition = healthplan.condition(healthplan.problems(devices, view.node), previous, timestamp(time.time()))
        if condition is not None:
            self.ctx.writer.seen(self.ctx.api.patch_node_status(self.ctx.options.node,
                                                                {"status": {"conditions": [condition]}}))
        if self.ctx.options.taint_unhealthy:
            wanted = healthplan.taint_wanted(devices, view.node)
            self.ctx.writer.update(lambda n: taint_patch(n, wanted), "the unhealthy GPU taint")
