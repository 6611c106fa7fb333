"""Events about the Node (core/v1, what ``kubectl describe node`` lists), recorded as
Kubernetes' own recorder (client-go's EventCorrelator) does: an Event that repeats one
already recorded (same type, reason and message) is not a new Event but that one's
``count`` and ``lastTimestamp`` raised. A flood (an XID storm) costs at most one write per
``min_interval`` for each distinct Event: repeats in between are added up and written
together. Events are best effort: one that cannot be written is tried again a few times,
then dropped with a warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..kubeerror import KubeError

__all__ = ["EventRecorder", "NORMAL", "WARNING", "timestamp"]

log = logging.getLogger("hostagent.plugins")

NORMAL, WARNING = "Normal", "Warning"
CACHE = 4096                 # distinct Events remembered (client-go's maxLruCacheEntries)
MESSAGE = 1024               # longer messages are cut (the API's limit for events.k8s.io)
RETRIES = 12                 # tries of an Event that cannot be written (client-go's maxTriesPerEvent)


def timestamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass
class _Entry:
    first: float
    count: int = 0               # times recorded
    written: int = 0             # the count the API server has
    written_at: float = 0.0
    name: str | None = None      # the Event's, once created
    failures: int = 0
    timer: threading.Timer | None = None


class EventRecorder:
    def __init__(self, api, node: str, namespace: str, component: str, node_uid=lambda: None,
                 min_interval: float = 1.0, clock=time.time):
        self.api = api
        self.node = node
        self.namespace = namespace
        self.component = component
        self.node_uid = node_uid           # the Node's uid when known (kubectl describe matches either)
        self.min_interval = min_interval
        self.clock = clock
        self.writes = 0
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.RLock()
        self._closed = False

    def record(self, kind: str, reason: str, message: str) -> None:
        """Record an Event of ``kind`` (Normal or Warning) about the Node."""
        message = message if len(message) <= MESSAGE else message[:MESSAGE - 3] + "..."
        key = (kind, reason, message)
        log.log(logging.WARNING if kind == WARNING else logging.INFO, "%s: %s", reason, message)
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                entry = self._cache[key] = _Entry(first=self.clock())
                while len(self._cache) > CACHE:
                    _, old = self._cache.popitem(last=False)
                    if old.timer:
                        old.timer.cancel()
            self._cache.move_to_end(key)
            entry.count += 1
            if entry.timer is None:
                wait = entry.written_at + self.min_interval - self.clock() if entry.name else 0.0
                if wait <= 0:
                    self._write(key, entry)
                else:
                    self._arm(key, entry, wait)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for entry in self._cache.values():
                if entry.timer:
                    entry.timer.cancel()
                    entry.timer = None

    # ---- writing ----------------------------------------------------------------------

    def _arm(self, key, entry: _Entry, delay: float) -> None:
        if self._closed:
            return
        entry.timer = threading.Timer(delay, self._flush, (key,))
        entry.timer.daemon = True
        entry.timer.start()

    def _flush(self, key) -> None:
        with self._lock:
            entry = self._cache.get(key)
            if entry is None or self._closed:
                return
            entry.timer = None
            if entry.count > entry.written:
                self._write(key, entry)

    def _body(self, key, entry: _Entry, now: float) -> dict:
        kind, reason, message = key
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node_uid() or self.node}
        return {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{self.node}.{time.time_ns():x}", "namespace": self.namespace},
                "involvedObject": involved, "type": kind, "reason": reason, "message": message,
                "source": {"component": self.component, "host": self.node},
                "reportingComponent": self.component, "reportingInstance": self.node,
                "firstTimestamp": timestamp(entry.first), "lastTimestamp": timestamp(now), "count": entry.count}

    def _write(self, key, entry: _Entry) -> None:
        now = self.clock()
        try:
            if entry.name is not None:
                try:
                    self.api.patch_event(self.namespace, entry.name,
                                         {"count": entry.count, "lastTimestamp": timestamp(now)})
                except KubeError as e:
                    if e.status != 404:
                        raise
                    entry.name = None      # expired (the API server keeps Events an hour): a new one
            if entry.name is None:
                entry.name = self.api.create_event(self._body(key, entry, now))["metadata"]["name"]
        except KubeError as e:
            entry.failures += 1
            if entry.failures >= RETRIES:
                log.warning("Event %s dropped after %d tries: %s", key[1], entry.failures, e.message)
                entry.failures, entry.written = 0, entry.count
                return
            if entry.failures == 1:
                log.warning("Event %s not written yet (%s); trying again", key[1], e.message)
            self._arm(key, entry, min(30.0, 2.0 ** entry.failures))
            return
        self.writes += 1
        entry.failures, entry.written, entry.written_at = 0, entry.count, now
