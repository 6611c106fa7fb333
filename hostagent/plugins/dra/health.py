"""The health of the published devices as the kubelet's DRAResourceHealth stream says it.

``device_health`` is pure: each published device's status from the agent's view of the
device it stands for (a partition not created yet: its GPU's), ``HEALTHY``, ``UNHEALTHY``
or, when nothing watches it or the agent cannot be reached, ``UNKNOWN``. The ``Board`` holds
the list the streams send: the whole list at once, again at each change, and every
``heartbeat`` seconds so the kubelet never times a device out to Unknown.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Entry", "Board", "device_health", "HEALTHY", "UNHEALTHY", "UNKNOWN"]

HEALTHY, UNHEALTHY, UNKNOWN = "HEALTHY", "UNHEALTHY", "UNKNOWN"


@dataclass(frozen=True)
class Entry:
    pool: str
    device: str
    status: str                 # HEALTHY, UNHEALTHY or UNKNOWN
    message: str = ""


def _status(view: dict | None, connected: bool) -> tuple[str, str]:
    if not connected:
        return UNKNOWN, "the hostagent daemon is not reachable"
    if view is None:
        return UNKNOWN, "not in the agent's inventory"
    health = view.get("health") or {}
    state = health.get("state")
    if state == "healthy":
        return HEALTHY, ""
    if state == "unhealthy":
        return UNHEALTHY, health.get("message") or health.get("reason") or "unhealthy"
    return UNKNOWN, health.get("message") or "not monitored"


def device_health(pool: str, published, views: dict[str, dict], connected: bool) -> list[Entry]:
    """``published``: (device name, agent UUID whose health it has) pairs, in slice order."""
    return [Entry(pool, name, *_status(views.get(uuid), connected)) for name, uuid in published]


class Board:
    def __init__(self, heartbeat: float = 10.0, timeout: int = 30):
        """``timeout``: what each entry tells the kubelet to wait before it takes a device it
        hears nothing more of as Unknown (three heartbeats)."""
        self.heartbeat = heartbeat
        self.timeout = timeout
        self._cond = threading.Condition()
        self._entries: tuple[Entry, ...] = ()
        self._version = 0
        self._stopped = False

    @property
    def entries(self) -> tuple[Entry, ...]:
        return self._entries

    def set(self, entries) -> bool:
        """The new list; True (and every stream sends it) when it changed."""
        entries = tuple(entries)
        with self._cond:
            if entries == self._entries:
                return False
            self._entries = entries
            self._version += 1
            self._cond.notify_all()
        return True

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def follow(self, active):
        """The list now, then at each change or heartbeat, while ``active()`` and not stopped."""
        sent = None
        while True:
            with self._cond:
                if sent is not None:
                    self._cond.wait_for(lambda: self._version != sent or self._stopped or not active(),
                                        self.heartbeat)
                if self._stopped or not active():
                    return
                sent, entries = self._version, self._entries
            yield entries
