"""The watch stream: a snapshot (or the events a resuming client missed), then every event
as it is published, with heartbeats while nothing happens.

Each watcher only remembers the last revision it sent and reads the shared event ring
after it, so a slow watcher holds no queue; one that falls out of the ring (or resumes
from a revision the agent never had) gets a fresh snapshot, marked with its reason.
"""

from __future__ import annotations

import asyncio
import json

__all__ = ["watch_stream", "snapshot_line"]


def snapshot_line(agent, reason: str) -> tuple[int, bytes]:
    from ..daemon.views import allocation_view, with_device_marks
    snap = agent.snapshot

    def render():
        return json.dumps({"type": "snapshot", "revision": snap.revision, "reason": reason,
                           "node": {"revision": snap.revision, **snap.node},
                           "gpus": snap.gpus, "mig_devices": snap.mig_devices,
                           "unreadable": snap.unreadable,
                           "allocations": [with_device_marks(allocation_view(a), snap.devices)
                                           for a in snap.allocations.values()]},
                          separators=(",", ":")).encode() + b"\n"
    return snap.revision, snap.cached(("snapshot", reason), render)


def watch_stream(agent, since: int | None):
    events = agent.events
    heartbeat = agent.settings.api.watch_heartbeat

    async def produce(stream):
        if since is None:
            position, line = snapshot_line(agent, "initial")
            await stream.send(line)
        else:
            position = since
        while not stream.closed:
            lines = events.after(position)
            if lines is None:
                position, line = snapshot_line(agent, "too_far_behind")
                await stream.send(line)
                continue
            if lines:
                position += len(lines)
                await stream.send(b"".join(lines))
                continue
            try:
                async with asyncio.timeout(heartbeat):
                    await asyncio.shield(events.changed())
            except TimeoutError:
                await stream.send(json.dumps({"type": "heartbeat", "revision": position},
                                             separators=(",", ":")).encode() + b"\n")
    return produce
