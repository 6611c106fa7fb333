"""Pods evicted through the Eviction API (policy/v1), as ``kubectl drain`` does: a 429 (a
PodDisruptionBudget forbids it now) is retried every ``retry`` seconds until ``timeout``; a
pod already gone counts as evicted; any other refusal is final for that pod.

The timeout counts from when a feature's evictions began, which the Node keeps in the
annotation ``hostagent.io/<feature>.eviction-started`` (Unix time, ``started_patch``), so a
controller restarted mid-eviction goes on with the time that is left rather than a new
timeout; the annotation goes when the feature is done with them (``ended_patch``).
"""

from __future__ import annotations

import logging
import threading
import time

from ..kubeerror import KubeError
from .keys import EVICTION_STARTED

__all__ = ["Evictor", "Refused", "started", "started_patch", "ended_patch"]

log = logging.getLogger("hostagent.plugins")


def _annotations(node: dict | None) -> dict:
    return ((node or {}).get("metadata") or {}).get("annotations") or {}


def started(node: dict | None, why: str) -> float | None:
    """When the evictions for ``why`` began (Unix time), None when none are under way."""
    try:
        return float(_annotations(node)[EVICTION_STARTED.format(why)])
    except (KeyError, ValueError):
        return None


def started_patch(node: dict, why: str, now: float) -> dict | None:
    """The patch recording that the evictions for ``why`` began ``now``; None when they had."""
    if started(node, why) is not None:
        return None
    return {"metadata": {"annotations": {EVICTION_STARTED.format(why): f"{now:.3f}"}}}


def ended_patch(node: dict, why: str) -> dict | None:
    key = EVICTION_STARTED.format(why)
    return {"metadata": {"annotations": {key: None}}} if key in _annotations(node) else None


class Refused(KubeError):
    """Pods that could not be evicted: ``pods`` maps ``namespace/name`` to why."""

    def __init__(self, pods: dict[str, str]):
        super().__init__("not evicted: " + "; ".join(f"{p} ({why})" for p, why in sorted(pods.items())))
        self.pods = pods


class Evictor:
    def __init__(self, api, timeout: float = 300.0, retry: float = 5.0, stop: threading.Event | None = None,
                 clock=time.monotonic):
        self.api = api
        self.timeout = timeout
        self.retry = retry
        self.stop = stop or threading.Event()
        self.clock = clock

    def evict(self, pods, left: float | None = None) -> None:
        """Evict each ``(namespace, name)``, retrying for ``left`` seconds (default: the
        timeout; once at least); Refused names those that were not."""
        deadline = self.clock() + (self.timeout if left is None else left)
        waiting = {f"{ns}/{name}": (ns, name) for ns, name in pods}
        refused: dict[str, str] = {}
        while waiting:
            for key, (ns, name) in list(waiting.items()):
                try:
                    self.api.evict(ns, name)
                except KubeError as e:
                    if e.status == 404:
                        waiting.pop(key)
                        continue
                    if e.status == 429 or e.unreachable:
                        refused[key] = e.message
                        continue
                    refused[key] = e.message
                    waiting.pop(key)
                    continue
                log.info("evicted pod %s", key)
                refused.pop(key, None)
                waiting.pop(key)
            if not waiting or self.clock() >= deadline or self.stop.wait(min(self.retry, max(0.0, deadline - self.clock()))):
                break
        for key in waiting:
            refused[key] = f"{refused.get(key, 'not evicted')}; gave up after {self.timeout:g} s"
        if refused:
            raise Refused(refused)
