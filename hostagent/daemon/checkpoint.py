"""The allocations checkpoint: ``<state_dir>/allocations.json`` and its journal,
``<state_dir>/allocations.journal``. Writing it is the commit point of an allocation: the
transient spec is written before it (so a crash in between leaves a spec the next start
removes) and removed after it (so a crash in between leaves a spec the next start removes
too).

A change is one line appended to the journal and made durable (``fdatasync``): the
allocations it puts (new, or changed) and the ids it drops, so a create that replaces
others is one line. One write to a file already open, where rewriting the whole checkpoint
took a new file, its fsync, a rename and the folder's fsync: the dearest part of an
allocation. Every ``COMPACT_AFTER`` lines, and at a process's first save, the whole set is
written to ``allocations.json`` atomically and durably and the journal emptied.

Reading applies the journal's lines, in order, to ``allocations.json``. A line is committed
only once it is whole on disk: a crash while one was written leaves a last line without
its newline (or not JSON), which is not applied, and the next save starts with a snapshot
that empties the journal. A crash between a snapshot and the journal's emptying applies
lines the snapshot holds already, which changes nothing: each line sets allocations to
what they are (or drops them), and the last line about an allocation decides.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from pathlib import Path

from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot
from .allocations import Allocation

__all__ = ["VERSION", "path", "journal_path", "read", "load", "save", "stray_temporaries", "COMPACT_AFTER"]

VERSION = 1
COMPACT_AFTER = 512                  # journal lines; a snapshot at every 512th change
MAX_JOURNAL = 8 << 20
log = logging.getLogger("hostagent.daemon")


def path(host: HostRoot) -> Path:
    return _paths(host)[0]


def journal_path(host: HostRoot) -> Path:
    return _paths(host)[1]


@functools.lru_cache(maxsize=16)
def _paths(host: HostRoot) -> tuple[Path, Path]:
    """Found once per host: resolving them through a host root that is not / cost more
    than a journal line's write."""
    return host.state_dir / "allocations.json", host.state_dir / "allocations.journal"


def read(host: HostRoot) -> list[Allocation]:
    """The checkpointed allocations, touching nothing (for commands that act on the node while
    the daemon is stopped); ValueError if the checkpoint is unreadable."""
    try:
        text = path(host).read_text()
    except FileNotFoundError:
        text = None
    try:
        entries = {}
        if text is not None:
            data = json.loads(text)
            if data.get("version") != VERSION:
                raise ValueError(f"unknown checkpoint version {data.get('version')!r}")
            entries = {a["id"]: a for a in data["allocations"]}
        for change in _journal(host):
            for a in change["put"]:
                entries[a["id"]] = a
            for alloc_id in change["drop"]:
                entries.pop(alloc_id, None)
        return [Allocation.from_checkpoint(a) for a in entries.values()]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(str(e)) from None


def _journal(host: HostRoot) -> list[dict]:
    """The journal's committed lines: up to the first that is not whole (a write a crash cut)."""
    try:
        with open(journal_path(host), "rb") as f:
            data = f.read(MAX_JOURNAL + 1)
    except FileNotFoundError:
        return []
    if len(data) > MAX_JOURNAL:
        raise ValueError(f"the journal is larger than {MAX_JOURNAL} bytes")
    changes = []
    for line in data.split(b"\n")[:-1]:          # the part after the last newline is not whole
        try:
            change = json.loads(line)
        except ValueError:
            break
        if not isinstance(change, dict) or not isinstance(change.get("put"), list) \
                or not isinstance(change.get("drop"), list):
            break
        changes.append(change)
    return changes


def load(host: HostRoot) -> list[Allocation]:
    """The checkpointed allocations. An unreadable checkpoint is kept aside (never
    overwritten silently), with its journal, and the agent starts with none."""
    p = path(host)
    try:
        return read(host)
    except ValueError as e:
        stamp = int(time.time())
        aside = p.with_name(f"{p.name}.unreadable-{stamp}")
        if p.exists():
            p.rename(aside)
        journal = journal_path(host)
        if journal.exists():
            journal.rename(journal.with_name(f"{journal.name}.unreadable-{stamp}"))
        log.error("allocations checkpoint is unreadable (%s); kept as %s, starting with none",
                  e, aside, extra={"fields": {"checkpoint": str(aside)}})
        _writers.pop(str(p), None)
        return []


class _Writer:
    """This process's writing end of one checkpoint: what it last made durable (id ->
    entry, in order) and the journal open for appending. ``saved`` None: the next save
    writes a snapshot."""

    def __init__(self):
        self.saved: dict[str, str] | None = None
        self.lines = 0
        self.fd: int | None = None
        self.files: tuple | None = None      # _files() as this writer left them

    def untouched(self, host: HostRoot) -> bool:
        """Whether the files are as this writer left them (no other writer came between)."""
        try:
            return self._files(host) == self.files
        except OSError:
            return False

    def _files(self, host: HostRoot) -> tuple:
        st = os.stat(path(host))
        return st.st_ino, st.st_size, st.st_mtime_ns, os.fstat(self.fd).st_size


_writers: dict[str, _Writer] = {}
_lock = threading.Lock()


def save(host: HostRoot, allocations) -> None:
    """Make ``allocations`` (the whole set) the checkpoint, durably: one journal line with
    what changed since the last save, or a snapshot."""
    current = {a.id: a.checkpoint_json for a in allocations}
    with _lock:
        writer = _writers.setdefault(str(path(host)), _Writer())
        try:
            if writer.saved is None or writer.lines >= COMPACT_AFTER or not writer.untouched(host):
                _snapshot(host, writer, current)
            else:
                _append(writer, current)
            writer.files = writer._files(host)
        except BaseException:
            writer.saved = None                  # a line may be half written: snapshot next time
            raise


def _append(writer: _Writer, current: dict[str, str]) -> None:
    put = [entry for alloc_id, entry in current.items() if writer.saved.get(alloc_id) != entry]
    drop = [alloc_id for alloc_id in writer.saved if alloc_id not in current]
    if put or drop:
        line = f'{{"put":[{",".join(put)}],"drop":{json.dumps(drop, separators=(",", ":"))}}}\n'.encode()
        written = os.write(writer.fd, line)
        if written != len(line):
            raise OSError(f"short write to the allocations journal ({written} of {len(line)} bytes)")
        os.fdatasync(writer.fd)
        writer.lines += 1
    writer.saved = current


def _snapshot(host: HostRoot, writer: _Writer, current: dict[str, str]) -> None:
    """The whole set to allocations.json, then an empty journal. The journal exists before
    the snapshot's durable write (whose folder fsync makes its entry durable too)."""
    ensure_dir(host.state_dir, 0o700)
    if writer.fd is None:
        writer.fd = os.open(journal_path(host), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    entries = ",\n".join(current.values())
    write_atomic(path(host), f'{{"version":{VERSION},"allocations":[\n{entries}\n]}}\n', mode=0o600)
    os.ftruncate(writer.fd, 0)
    os.fdatasync(writer.fd)
    writer.saved, writer.lines = current, 0


def stray_temporaries(host: HostRoot) -> list[Path]:
    """Temporary files of checkpoint writes a kill interrupted."""
    p = path(host)
    return sorted(p.parent.glob(f".{p.name}.*.tmp")) if p.parent.is_dir() else []
