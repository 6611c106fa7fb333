"""Revisions and the event log that watch streams read.

Every change the agent publishes (a device added, removed or changed, its health, an
allocation, the node's facts) is one event with the next revision. Revisions never repeat,
not even across restarts and crashes: the clock reserves blocks of them in the state
directory before using them (hi/lo), so a watcher's ``since`` from an earlier run of the
daemon is always older than anything the current run publishes.

Events are serialised once, as the NDJSON line watchers receive, and kept in a ring of
``capacity`` events and at most ``max_bytes`` of lines (an allocation's events carry its
container edits, some 17 KB each: 4096 of them would hold 70 MB); each watcher keeps only
its position in the ring, so a slow watcher costs no memory and a watcher that fell out of
the ring gets a fresh snapshot instead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from pathlib import Path

from ..fileio import ensure_dir, write_atomic

__all__ = ["RevisionClock", "EventLog", "Rendered", "BLOCK"]

BLOCK = 1 << 20
MAX_BYTES = 4 << 20


class Rendered(bytes):
    """A payload value already rendered as JSON, put in the event's line as it is."""


class RevisionClock:
    def __init__(self, path: Path | None, block: int = BLOCK):
        """``path`` None: in memory only (tests of pure code)."""
        self.path = path
        self.block = block
        start = 0
        if path is not None:
            try:
                start = int(path.read_text().strip() or 0)
            except (FileNotFoundError, ValueError):
                start = 0
        self.current = start
        self.limit = start
        self._reserve()

    def _reserve(self) -> None:
        self.limit = self.current + self.block
        if self.path is not None:
            ensure_dir(self.path.parent, 0o700)
            write_atomic(self.path, f"{self.limit}\n", mode=0o600)

    def next(self) -> int:
        self.current += 1
        if self.current >= self.limit:
            self._reserve()
        return self.current


class EventLog:
    def __init__(self, clock: RevisionClock, capacity: int = 4096, max_bytes: int = MAX_BYTES):
        self.clock = clock
        # (revision, line, type, the allocations it moved when that is all it changed, or None)
        self.ring: deque[tuple[int, bytes, str, frozenset | None]] = deque(maxlen=capacity)
        self.max_bytes = max_bytes
        self.bytes = 0                                  # of the lines in the ring
        self._changed: asyncio.Future | None = None

    @property
    def revision(self) -> int:
        return self.clock.current

    @property
    def oldest(self) -> int:
        """The oldest revision a watcher may resume after without a snapshot."""
        return self.ring[0][0] - 1 if self.ring else self.clock.current

    def resize(self, capacity: int) -> None:
        if capacity != self.ring.maxlen:
            self.ring = deque(self.ring, maxlen=capacity)
            self.bytes = sum(len(entry[1]) for entry in self.ring)

    def publish(self, type_: str, payload=None, moved: frozenset | None = None) -> int:
        """Append one event; wake every watcher. ``payload``: a dict, or a function of the
        event's revision returning one (for views that carry their own revision); a value
        that is ``Rendered`` is put in as it is, after the others (its key a plain name).
        ``moved``: the allocation ids a device change added or removed, when that is all it
        changed (``after``'s ``own``). Call on the event loop's thread."""
        revision = self.clock.next()
        if callable(payload):
            payload = payload(revision)
        payload = payload or {}
        event = {"type": type_, "revision": revision, "time": round(time.time(), 3),
                 **{k: v for k, v in payload.items() if not isinstance(v, Rendered)}}
        line = json.dumps(event, separators=(",", ":")).encode()
        rendered = [b',"%s":%s' % (k.encode(), v) for k, v in payload.items() if isinstance(v, Rendered)]
        if rendered:
            line = line[:-1] + b"".join(rendered) + b"}"
        line += b"\n"
        ring = self.ring
        if len(ring) == ring.maxlen:
            self.bytes -= len(ring[0][1])                # the append drops it
        ring.append((revision, line, type_, moved))
        self.bytes += len(line)
        while self.bytes > self.max_bytes and len(ring) > 1:
            self.bytes -= len(ring.popleft()[1])
        waiter, self._changed = self._changed, None
        if waiter is not None and not waiter.done():
            waiter.set_result(revision)
        return revision

    def after(self, since: int, types: frozenset[str] | None = None, own: str | None = None) -> list[bytes] | None:
        """Lines of the events after ``since`` (of ``types`` only, when given; without the
        device changes only in allocations whose ids all start with ``own``, when given);
        None when ``since`` is outside the ring (too old, or from the future), so the watcher
        needs a snapshot."""
        if since < self.oldest or since > self.clock.current:
            return None
        if since == self.clock.current:
            return []
        # Revisions in the ring are consecutive: index by offset.
        ring = self.ring
        start = since + 1 - ring[0][0]
        entries = (ring[i] for i in range(start, len(ring)))     # deque indexes cheaply near its ends
        return [line for _, line, type_, moved in entries if (types is None or type_ in types)
                and not (own and moved and all(a.startswith(own) for a in moved))]

    def changed(self) -> asyncio.Future:
        """A future resolved at the next publish; shared by all watchers."""
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed
