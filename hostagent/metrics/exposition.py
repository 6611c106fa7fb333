"""The metrics page: DCGM-compatible families from the sampler's last snapshot, device health,
and hostagent's own metrics. ``render()`` never calls NVML; the same bytes serve the TCP
endpoint and the API socket's ``/metrics``."""

from __future__ import annotations

import threading

from . import render as R
from .labels import LabelHook, base_labels

__all__ = ["Exporter", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Exporter:
    """``health``: a callable returning the current ``HealthState`` (``monitor`` property
    ``state``) or None; ``device_labels``: extra labels per device UUID (allocations);
    ``agent``: an ``AgentMetrics`` whose collectors are appended."""

    def __init__(self, inventory, sampler, *, hostname: str, health=None,
                 device_labels: LabelHook | None = None, agent=None):
        self.sampler = sampler
        self.hostname = hostname
        self.health = health
        self.device_labels = device_labels
        self.agent = agent
        self._lock = threading.Lock()
        self._cache: tuple | None = None
        self.update_inventory(inventory)

    def update_inventory(self, inventory) -> None:
        with self._lock:
            self._base = base_labels(inventory, self.hostname)
            self._members = R.members(inventory)
            self._strings = None
            self._cache = None

    def _label_strings(self, extra):
        key = tuple(sorted((u, tuple(sorted(v.items()))) for u, v in extra.items()))
        if self._strings is None or self._strings[0] != key:
            self._strings = (key, R.label_strings(self._base, self._members, extra))
        return self._strings

    def render(self) -> bytes:
        snapshot = self.sampler.snapshot
        state = self.health() if self.health is not None else None
        extra = self.device_labels() if self.device_labels is not None else {}
        with self._lock:
            extra_key, strings = self._label_strings(extra)
            key = (id(snapshot), getattr(state, "revision", None), extra_key)
            if self._cache is None or self._cache[0] != key:
                text = R.render_dcgm(snapshot, strings, R.last_xids(state, self._members))
                text += R.render_health(state, self.hostname, extra)
                # keep the snapshot referenced: its id() must not be reused while cached
                self._cache = (key, text.encode(), snapshot)
            body = self._cache[1]
        if self.agent is not None:
            body += self.agent.render()
        return body
