"""The watch stream: a snapshot (or the events a resuming client missed), then every event
as it is published, with heartbeats while nothing happens, and a ``stopping`` line before
the stream's end when the daemon stops.

Each watcher only remembers the last revision it sent and reads the shared event ring
after it, so a slow watcher holds no queue; one that falls out of the ring (or resumes
from a revision the agent never had) gets a fresh snapshot, marked with its reason.
"""

from __future__ import annotations

import asyncio
import json
import re

__all__ = ["WatchStream", "snapshot_line", "EVENT_TYPES", "watch_types", "watch_own"]

# What ?types= may name: the events (snapshot, heartbeat and stopping lines always come).
EVENT_TYPES = ("device_added", "device_changed", "device_removed", "node_changed", "allocation_created",
               "allocation_deleted", "health_event", "labels_changed", "driver_changed", "sharing_changed")


def snapshot_line(agent, reason: str) -> tuple[int, bytes]:
    from ..daemon.views import with_device_marks
    from ..model import allocation
    snap = agent.snapshot

    def render():
        return json.dumps({"type": "snapshot", "revision": snap.revision, "reason": reason,
                           "node": {"revision": snap.revision, **snap.node},
                           "gpus": snap.gpus, "mig_devices": snap.mig_devices,
                           "unreadable": snap.unreadable, "unread": snap.unread,
                           "allocations": [with_device_marks(allocation(a), snap.devices)
                                           for a in snap.allocations.values()]},
                          separators=(",", ":")).encode() + b"\n"
    return snap.revision, snap.cached(("snapshot", reason), render)


def watch_types(text: str | None) -> frozenset[str] | None:
    """``?types=`` (comma-separated event types) as a set; None (all) when not given."""
    if text is None:
        return None
    from ..errors import UsageError
    from ..suggest import unknown
    types = frozenset(t.strip() for t in text.split(",") if t.strip())
    for t in sorted(types):
        if t not in EVENT_TYPES:
            raise UsageError(unknown("event type", t, EVENT_TYPES), parameter="types",
                             hint=f"types is a comma-separated list of {', '.join(EVENT_TYPES)}")
    if not types:
        raise UsageError("types names no event type", parameter="types",
                         hint=f"name one or more of {', '.join(EVENT_TYPES)}, or leave types out for all")
    return types


_OWN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")


def watch_own(text: str | None) -> str | None:
    """``?own=``: the id prefix of the watcher's own allocations. The device changes only in
    the allocations lists, by allocations whose ids start with it, are left out: a kubelet
    plugin learns of its allocations from the answers, and each makes one or two."""
    if text is None:
        return None
    if not _OWN.fullmatch(text):
        from ..errors import UsageError
        raise UsageError(f"own {text[:40]!r} is not an allocation id prefix", parameter="own",
                         hint="1 to 128 of A-Z a-z 0-9 _ . : / -, starting with a letter or digit")
    return text


def _marker(type_: str, revision: int) -> bytes:
    return json.dumps({"type": type_, "revision": revision}, separators=(",", ":")).encode() + b"\n"


class WatchStream:
    """One watcher: ``await stream(sink)`` sends until the client leaves; ``farewell()`` is
    the last line when the daemon stops (the stream then ends cleanly, not cut off)."""

    def __init__(self, agent, since: int | None, types: frozenset[str] | None = None, own: str | None = None):
        self.agent = agent
        self.position = since        # the last revision the client has (None: a snapshot first)
        self.types = types           # the event types it wants (None: all)
        self.own = own               # the id prefix of its own allocations (watch_own)

    def farewell(self) -> bytes:
        return _marker("stopping", self.position or 0)

    async def __call__(self, stream) -> None:
        agent = self.agent
        events = agent.events
        heartbeat = agent.settings.api.watch_heartbeat
        if self.position is None:
            self.position, line = snapshot_line(agent, "initial")
            await stream.send(line)
        while not stream.closed:
            lines = events.after(self.position, self.types, self.own)
            if lines is None:
                self.position, line = snapshot_line(agent, "too_far_behind")
                await stream.send(line)
                continue
            # Past the events it does not want too: its next heartbeat says where it is.
            self.position = events.revision
            if lines:
                await stream.send(b"".join(lines))
                continue
            try:
                async with asyncio.timeout(heartbeat):
                    await asyncio.shield(events.changed())
            except TimeoutError:
                await stream.send(_marker("heartbeat", self.position))
