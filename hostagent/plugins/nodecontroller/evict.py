"""Pods evicted through the Eviction API (policy/v1), as ``kubectl drain`` does: a 429 (a
PodDisruptionBudget forbids it now) is retried every ``retry`` seconds until ``timeout``; a
pod already gone counts as evicted; any other refusal is final for that pod."""

from __future__ import annotations

import logging
import threading
import time

from ..kubeerror import KubeError

__all__ = ["Evictor", "Refused"]

log = logging.getLogger("hostagent.plugins")


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
        self.evicted: list[str] = []

    def evict(self, pods) -> None:
        """Evict each ``(namespace, name)``; Refused names those that were not."""
        deadline = self.clock() + self.timeout
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
                self.evicted.append(key)
                refused.pop(key, None)
                waiting.pop(key)
            if not waiting or self.clock() >= deadline or self.stop.wait(min(self.retry, max(0.0, deadline - self.clock()))):
                break
        for key in waiting:
            refused[key] = f"{refused.get(key, 'not evicted')}; gave up after {self.timeout:g} s"
        if refused:
            raise Refused(refused)
