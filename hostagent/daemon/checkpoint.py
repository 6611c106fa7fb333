"""The allocations checkpoint: ``<state_dir>/allocations.json`` and its journal,
``<state_dir>/allocations.journal``. Writing it is the commit point of an allocation: the
transient spec is written before it (so a crash in between leaves a spec the next start
removes) and removed after it (so a crash in between leaves a spec the next start removes
too).

A change is one line appended to the journal and made durable (``fdatasync``): the
allocations it puts (new, or changed) and the ids it drops, so a create that replaces
others is one line. One write to a file already open, where rewriting the whole checkpoint
took a new file, its fsync, a rename and the folder's fsync: the dearest part of an
allocation. Every ``COMPACT_AFTER`` lines, once the journal holds ``COMPACT_BYTES``, and at
a process's first save, the whole set is written to ``allocations.json`` atomically and
durably and the journal emptied: the journal never grows much past what one snapshot holds,
whatever callers put in their allocations.

Reading applies the journal's lines, in order, to ``allocations.json``. A line is committed
only once it is whole on disk: a crash while one was written leaves a last line without
its newline, which is not applied, and the next save starts with a snapshot that empties
the journal. Each snapshot names a new journal (``"journal": <token>``) and the journal
emptied after it starts with a line naming the same token: the lines of a journal that the
snapshot does not name are older than it, and not applied. (A crash between a snapshot and
its journal's emptying would otherwise apply lines the snapshot holds already: a line that
dropped an allocation the snapshot holds again, made anew since, lost it.) A snapshot
without a token (an earlier version's) takes every line.

Nothing is refused for its size. A checkpoint that is damaged (a snapshot or a journal line
that is not what this module writes, an entry that is not an allocation) never becomes an
empty one: ``load`` keeps every allocation it can read, keeps the files as they were beside
them (``*.unreadable-<time>``), and records each unreadable record in
``allocations.unreadable.json`` with the devices it names (``GPU-``/``MIG-`` UUIDs in its
text; none found: it may hold any device). The agent refuses those devices to new
allocations, says so (its log, ``GET /v1/node``, a metric, ``hostagentd --check``) until an
admin dismisses the records (``DELETE /v1/checkpoint/unreadable``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import faults
from ..fileio import ensure_dir, remove, write_atomic
from ..hostroot import HostRoot
from .allocations import Allocation

__all__ = ["VERSION", "path", "journal_path", "unreadable_path", "read", "load", "save", "stray_temporaries",
           "COMPACT_AFTER", "COMPACT_BYTES", "Unreadable", "unreadable", "dismiss", "held_devices"]

VERSION = 1
COMPACT_AFTER = 512                  # journal lines; a snapshot at every 512th change
COMPACT_BYTES = 1 << 20              # journal bytes: a snapshot once the journal holds this much
log = logging.getLogger("hostagent.daemon")
_UUID = re.compile(rb"(?:GPU|MIG)-[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}")
_HEADER = re.compile(rb'\{"version":([0-9]+),(?:"journal":"[0-9a-f]*",)?"allocations":\[')


def path(host: HostRoot) -> Path:
    return _paths(host)[0]


def journal_path(host: HostRoot) -> Path:
    return _paths(host)[1]


def unreadable_path(host: HostRoot) -> Path:
    """The record of what was found unreadable and set aside (present: the checkpoint is damaged)."""
    return host.state_dir / "allocations.unreadable.json"


@functools.lru_cache(maxsize=16)
def _paths(host: HostRoot) -> tuple[Path, Path]:
    """Found once per host: resolving them through a host root that is not / cost more
    than a journal line's write."""
    return host.state_dir / "allocations.json", host.state_dir / "allocations.journal"


@dataclass(frozen=True)
class Unreadable:
    """A record of the checkpoint that could not be read: why, where it is kept, the devices
    it names (None: it names none, so it may hold any)."""
    found: str
    reason: str
    kept_as: str
    devices: tuple[str, ...] | None
    digest: str

    def to_json(self) -> dict:
        return {"found": self.found, "reason": self.reason, "kept_as": self.kept_as,
                "devices": None if self.devices is None else list(self.devices), "digest": self.digest}

    @classmethod
    def from_json(cls, raw: dict) -> "Unreadable":
        devices = raw.get("devices")
        return cls(str(raw["found"]), str(raw["reason"]), str(raw["kept_as"]),
                   None if devices is None else tuple(str(d) for d in devices), str(raw["digest"]))


@dataclass
class _Reading:
    allocations: list[Allocation]
    problems: list[tuple[str, bytes, str]]      # (why, the record's text, the file it is in)


def read(host: HostRoot) -> list[Allocation]:
    """The checkpointed allocations, touching nothing (for commands that act on the node while
    the daemon is stopped); ValueError if any record is unreadable, or records the daemon
    found unreadable are not yet dismissed (the devices they may hold are unknown)."""
    reading = _read(host)
    if reading.problems:
        why = reading.problems[0][0]
        more = len(reading.problems) - 1
        raise ValueError(why + (f", and {more} more unreadable record(s)" if more else ""))
    damage = unreadable(host)
    if damage:
        raise ValueError(f"{len(damage)} unreadable record(s) set aside, not yet dismissed "
                         f"({unreadable_path(host)})")
    return reading.allocations


def _read(host: HostRoot) -> _Reading:
    """Every allocation that can be read, and what cannot."""
    problems: list[tuple[str, bytes, str]] = []
    try:
        text = path(host).read_bytes()
    except FileNotFoundError:
        text = None
    entries: dict[str, dict] = {}
    token = None                         # the journal the snapshot names (None: any, an earlier version's)
    if text is not None:
        entries, token = _snapshot_entries(text, problems, str(path(host)))
    lines = _journal(host)
    head = _journal_token(lines[0][1]) if lines else None
    if head is not None:
        lines = lines[1:]
    if token is not None and head != token:
        lines = []                       # older than the snapshot, which holds what they did
    for number, line in lines:
        where = str(journal_path(host))
        try:
            change = json.loads(line)
        except ValueError:
            problems.append((f"journal line {number} is not JSON", line, where))
            continue
        if not isinstance(change, dict) or not isinstance(change.get("put"), list) \
                or not isinstance(change.get("drop"), list):
            problems.append((f"journal line {number} is not a change", line, where))
            continue
        for a in change["put"]:
            if isinstance(a, dict) and isinstance(a.get("id"), str):
                entries[a["id"]] = a
            else:
                problems.append((f"journal line {number} puts an entry without an id", _dump(a), where))
        for alloc_id in change["drop"]:
            if isinstance(alloc_id, str):
                entries.pop(alloc_id, None)
            else:
                problems.append((f"journal line {number} drops an id that is not a string", _dump(alloc_id), where))
    allocations = []
    for alloc_id, a in entries.items():
        try:
            allocations.append(Allocation.from_checkpoint(a))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            problems.append((f"allocation {alloc_id!r} cannot be read ({type(e).__name__}: {e})", _dump(a),
                             str(path(host))))
    return _Reading(allocations, problems)


def _dump(entry) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()


def _journal_token(line: bytes) -> str | None:
    """The token of a journal's first line, when it is the line naming the journal."""
    if not line.startswith(b'{"journal":'):
        return None
    try:
        head = json.loads(line)
    except ValueError:
        return None
    return head["journal"] if isinstance(head, dict) and set(head) == {"journal"} \
        and isinstance(head["journal"], str) else None


def _snapshot_entries(text: bytes, problems: list, where: str) -> tuple[dict[str, dict], str | None]:
    """(id -> entry, the journal it names) of a snapshot; a snapshot that is not JSON is
    read line by line (this module writes one entry a line), each line that is not an entry
    a problem of its own, and then takes no journal (which lines it holds is unknown)."""
    try:
        data = json.loads(text)
    except ValueError:
        return _salvage(text, problems, where), None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("allocations"), list):
        what = f"unknown checkpoint version {data.get('version')!r}" if isinstance(data, dict) else "not a checkpoint"
        problems.append((f"{where}: {what}", text, where))
        return {}, None
    entries = {}
    for a in data["allocations"]:
        if isinstance(a, dict) and isinstance(a.get("id"), str):
            entries[a["id"]] = a
        else:
            problems.append((f"{where}: an entry without an id", _dump(a), where))
    token = data.get("journal")
    return entries, token if isinstance(token, str) else None


def _salvage(text: bytes, problems: list, where: str) -> dict[str, dict]:
    lines = text.split(b"\n")
    header = _HEADER.fullmatch(lines[0].strip()) if lines else None
    if header is not None and int(header.group(1)) != VERSION:
        problems.append((f"{where}: unknown checkpoint version {int(header.group(1))}", text, where))
        return {}
    entries = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line in (b"]}", b"]") or (number == 1 and header is not None):
            continue
        try:
            a = json.loads(line.removesuffix(b","))
        except ValueError:
            a = None
        if isinstance(a, dict) and isinstance(a.get("id"), str):
            entries[a["id"]] = a
        else:
            problems.append((f"{where}: line {number} is not an allocation", line, where))
    return entries


def _journal(host: HostRoot) -> list[tuple[int, bytes]]:
    """The journal's whole lines, numbered (not the part after the last newline: a write a
    crash cut). Read whatever its size: nothing is refused for it."""
    try:
        with open(journal_path(host), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return [(n, line) for n, line in enumerate(data.split(b"\n")[:-1], 1) if line.strip()]


def load(host: HostRoot) -> list[Allocation]:
    """The checkpointed allocations, every one that can be read. Records that cannot be read
    are set aside (``Unreadable``, with the files as they were), the checkpoint rewritten
    with what was read, and each logged as an error."""
    reading = _read(host)
    if not reading.problems:
        return reading.allocations
    stamp = time.strftime("%Y%m%dT%H%M%S")
    snapshot, journal = path(host), journal_path(host)
    kept = {}
    damaged = {where for _, _, where in reading.problems}
    for p in (snapshot, journal):
        if str(p) in damaged and p.exists():
            aside = p.with_name(f"{p.name}.unreadable-{stamp}")
            if not aside.exists():
                os.link(p, aside)          # the files as they were, kept whatever follows
            kept[str(p)] = str(aside)
    known = {u.digest for u in unreadable(host)}
    found = []
    for why, text, where in reading.problems:
        digest = hashlib.sha256(text).hexdigest()
        if digest in known:
            continue                        # found at an earlier start (a crash came before its rewrite)
        known.add(digest)
        uuids = tuple(sorted({u.decode() for u in _UUID.findall(text)})) or None
        found.append(Unreadable(stamp, why, kept.get(where, where), uuids, digest))
    if found:
        _record(host, [*unreadable(host), *found])
    # The checkpoint made whole with what was read: the snapshot first (it holds the
    # journal's readable changes, and names a journal that does not exist yet), then the
    # journal goes aside (its copy is kept).
    write_atomic(snapshot, _render({a.id: a.checkpoint_json for a in reading.allocations}, _token()), mode=0o600)
    if journal.exists():
        journal.unlink()
    writer = _writers.pop(str(snapshot), None)
    if writer is not None and writer.fd is not None:
        os.close(writer.fd)                  # its journal is gone: the next save opens the new one
    for u in found:
        log.error("allocations checkpoint: a record cannot be read (%s); kept in %s; %s held back from new "
                  "allocations until an admin dismisses it (DELETE /v1/checkpoint/unreadable)", u.reason,
                  u.kept_as, ", ".join(u.devices) if u.devices else "every device (it names none)",
                  extra={"fields": {"checkpoint": u.kept_as}})
    return reading.allocations


def unreadable(host: HostRoot) -> list[Unreadable]:
    """The unreadable records set aside and not dismissed."""
    try:
        raw = json.loads(unreadable_path(host).read_bytes())
        return [Unreadable.from_json(r) for r in raw["records"]]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as e:
        # The record of the damage is damaged itself: every device is held.
        return [Unreadable("?", f"{unreadable_path(host)} cannot be read ({e})", str(unreadable_path(host)),
                           None, "")]


def _record(host: HostRoot, records: list[Unreadable]) -> None:
    ensure_dir(host.state_dir, 0o700)
    write_atomic(unreadable_path(host), json.dumps({"version": VERSION, "records": [r.to_json() for r in records]},
                                                   indent=1), mode=0o600)


def dismiss(host: HostRoot) -> list[Unreadable]:
    """An admin's decision: the records set aside no longer hold devices (their files stay)."""
    records = unreadable(host)
    remove(unreadable_path(host))
    return records


def held_devices(records: list[Unreadable]) -> frozenset[str] | None:
    """The devices unreadable records may hold; None: any."""
    out: set[str] = set()
    for r in records:
        if r.devices is None:
            return None
        out.update(r.devices)
    return frozenset(out)


class _Writer:
    """This process's writing end of one checkpoint: what it last made durable (id ->
    entry, in order) and the journal open for appending. ``saved`` None: the next save
    writes a snapshot."""

    def __init__(self):
        self.saved: dict[str, str] | None = None
        self.lines = 0
        self.bytes = 0                       # in the journal since the last snapshot
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
            if writer.saved is None or writer.lines >= COMPACT_AFTER or writer.bytes >= COMPACT_BYTES \
                    or not writer.untouched(host):
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
        _write_line(writer.fd, line, "checkpoint:mid_line")
        os.fdatasync(writer.fd)
        writer.lines += 1
        writer.bytes += len(line)
    writer.saved = current


def _token() -> str:
    return os.urandom(8).hex()


def _render(current: dict[str, str], token: str) -> str:
    entries = ",\n".join(current.values())
    return f'{{"version":{VERSION},"journal":"{token}","allocations":[\n{entries}\n]}}\n'


def _write_line(fd: int, line: bytes, point: str | None = None) -> None:
    """Append ``line`` whole, or leave the journal as it was: a write the file system cuts
    short (a full disk) is taken back, so no part of a line stays on disk. ``point``: the
    crash point half-way through it (tests)."""
    written = 0
    try:
        if point is not None and faults.armed(point):
            written = os.write(fd, line[:len(line) // 2])
            faults.point(point)
        while written < len(line):
            written += os.write(fd, line[written:])
    except OSError:
        if written:
            os.ftruncate(fd, os.fstat(fd).st_size - written)
        raise


def _snapshot(host: HostRoot, writer: _Writer, current: dict[str, str]) -> None:
    """The whole set to allocations.json, naming a new journal; then the journal emptied
    and its first line naming it. The journal exists before the snapshot's durable write
    (whose folder fsync makes its entry durable too)."""
    ensure_dir(host.state_dir, 0o700)
    if writer.fd is None:
        writer.fd = os.open(journal_path(host), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    token = _token()
    write_atomic(path(host), _render(current, token), mode=0o600)
    faults.point("checkpoint:after_snapshot")
    os.ftruncate(writer.fd, 0)
    _write_line(writer.fd, f'{{"journal":"{token}"}}\n'.encode())
    os.fdatasync(writer.fd)
    writer.saved, writer.lines, writer.bytes = current, 0, 0


def stray_temporaries(host: HostRoot) -> list[Path]:
    """Temporary files of checkpoint writes a kill interrupted."""
    p = path(host)
    return sorted(p.parent.glob(f".{p.name}.*.tmp")) if p.parent.is_dir() else []
