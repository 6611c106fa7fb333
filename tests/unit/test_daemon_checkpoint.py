"""The allocations checkpoint: a snapshot and a journal of changes, read back as the last set
saved whatever a crash left (a half-written line, a snapshot not yet followed by the
journal's emptying), and rewritten whole when another writer came between."""

import dataclasses
import json
import os

import pytest

from hostagent.daemon import checkpoint
from hostagent.daemon.allocations import Allocation
from hostagent.hostroot import HostRoot


@pytest.fixture
def host(tmp_path):
    checkpoint._writers.clear()              # each test is a new process's first save
    yield HostRoot(tmp_path)
    for writer in checkpoint._writers.values():
        if writer.fd is not None:
            os.close(writer.fd)
    checkpoint._writers.clear()


def alloc(alloc_id: str, device: str = "GPU-0", created: float = 1.0) -> Allocation:
    return Allocation(alloc_id, (device,), {"id": alloc_id, "devices": [{"device": device}]}, created)


def ids(host) -> list[str]:
    return [a.id for a in checkpoint.read(host)]


def journal_lines(host) -> list[bytes]:
    return checkpoint.journal_path(host).read_bytes().splitlines(keepends=True)


def test_changes_are_journal_lines_read_back_over_the_snapshot(host):
    checkpoint.save(host, [alloc("a")])                              # a first save: the snapshot
    snapshot = checkpoint.path(host).read_text()
    assert ids(host) == ["a"] and journal_lines(host) == []
    checkpoint.save(host, [alloc("a"), alloc("b")])
    checkpoint.save(host, [alloc("a"), alloc("c")])                   # b replaced by c: one line
    checkpoint.save(host, [alloc("a", created=2.0), alloc("c")])      # a changed
    checkpoint.save(host, [alloc("a", created=2.0), alloc("c")])      # nothing changed: no line
    assert checkpoint.path(host).read_text() == snapshot
    lines = [json.loads(line) for line in journal_lines(host)]
    assert [([p["id"] for p in line["put"]], line["drop"]) for line in lines] == [
        (["b"], []), (["c"], ["b"]), (["a"], [])]
    assert [(a.id, a.created) for a in checkpoint.read(host)] == [("a", 2.0), ("c", 1.0)]


def test_the_journal_is_folded_into_the_snapshot_every_so_often(host, monkeypatch):
    monkeypatch.setattr(checkpoint, "COMPACT_AFTER", 3)
    for n in range(1, 6):
        checkpoint.save(host, [alloc(str(i)) for i in range(n)])
    # Saves 2-4 were lines; the fifth a snapshot holding all five, the journal emptied.
    assert len(json.loads(checkpoint.path(host).read_text())["allocations"]) == 5
    assert journal_lines(host) == [] and ids(host) == ["0", "1", "2", "3", "4"]


def test_a_line_a_crash_cut_is_not_applied_and_the_next_writer_starts_over(host):
    checkpoint.save(host, [alloc("a")])
    checkpoint.save(host, [alloc("a"), alloc("b")])
    with open(checkpoint.journal_path(host), "ab") as f:
        f.write(b'{"put":[],"drop":["a"]')                             # no newline: not committed
    assert ids(host) == ["a", "b"]
    with open(checkpoint.journal_path(host), "ab") as f:
        f.write(b'\n{"put":[],"drop":["b"]}\n')                       # after a cut line: not applied
    assert ids(host) == ["a", "b"]
    checkpoint._writers.clear()                                       # the daemon starts again
    checkpoint.save(host, [alloc("a"), alloc("b"), alloc("c")])
    assert journal_lines(host) == [] and ids(host) == ["a", "b", "c"]


def test_a_crash_between_a_snapshot_and_the_journals_emptying_changes_nothing(host):
    checkpoint.save(host, [alloc("a")])
    checkpoint.save(host, [alloc("a"), alloc("b")])
    checkpoint.save(host, [alloc("b", created=3.0)])
    lines = checkpoint.journal_path(host).read_bytes()
    checkpoint._writers.clear()
    checkpoint.save(host, [alloc("b", created=3.0)])                    # the snapshot...
    checkpoint.journal_path(host).write_bytes(lines)                    # ...and the journal as a crash left it
    assert [(a.id, a.created) for a in checkpoint.read(host)] == [("b", 3.0)]


def test_another_writer_between_two_saves_makes_the_next_one_a_snapshot(host):
    checkpoint.save(host, [alloc("a")])
    checkpoint.save(host, [alloc("a"), alloc("b")])
    checkpoint.path(host).write_text('{"version":1,"allocations":[]}')   # replaced behind the writer's back
    checkpoint.save(host, [alloc("a"), alloc("b"), alloc("c")])
    assert journal_lines(host) == [] and ids(host) == ["a", "b", "c"]
    with open(checkpoint.journal_path(host), "ab") as f:                # a line another writer appended
        f.write(b'{"put":[],"drop":["a"]}\n')
    checkpoint.save(host, [alloc("a"), alloc("b"), alloc("c"), alloc("d")])
    assert journal_lines(host) == [] and ids(host) == ["a", "b", "c", "d"]


def test_a_failed_append_leaves_the_last_durable_set_and_the_next_save_a_snapshot(host, monkeypatch):
    checkpoint.save(host, [alloc("a")])
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError):
        checkpoint.save(host, [alloc("a"), alloc("b")])
    monkeypatch.setattr(os, "fdatasync", real)
    checkpoint.save(host, [alloc("c")])
    assert journal_lines(host) == [] and ids(host) == ["c"]


def test_an_unreadable_checkpoint_is_set_aside_with_its_journal(host):
    checkpoint.save(host, [alloc("a")])
    checkpoint.save(host, [alloc("a"), alloc("b")])
    checkpoint.path(host).write_text("{broken")
    assert checkpoint.load(host) == []
    names = sorted(p.name.rsplit("-", 1)[0] for p in host.state_dir.iterdir())
    assert names == ["allocations.journal.unreadable", "allocations.json.unreadable"]
    checkpoint.save(host, [alloc("c")])
    assert ids(host) == ["c"]


def test_a_claims_allocation_reads_back_whole_from_a_journal_line(host):
    """Everything an allocation records (its owner, the MIG devices made for it, each
    device's own sharing, its own MPS daemon's process record) is in its journal line, and
    a change to one of them (the daemon started again) is a line of its own."""
    daemon = {"key": "alloc-0123", "devices": ["GPU-1"],
              "process": {"pid": 4242, "start": 1700000000.5, "exe": "2049:1234"}}
    mps = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}
    claim = Allocation("k8s-dra/uid-1", ("MIG-a", "GPU-1"),
                       {"id": "k8s-dra/uid-1", "devices": [], "sharing": {"strategy": "Exclusive"},
                        "own_mps_daemon": True}, 5.0, owner=1234, device_sharing={"GPU-1": mps},
                       made=({"uuid": "MIG-a", "gpu": "GPU-0", "profile": "1g.5gb", "start": 3},), mps=daemon)
    checkpoint.save(host, [alloc("a")])
    checkpoint.save(host, [alloc("a"), claim])
    assert len(journal_lines(host)) == 1
    [_, back] = checkpoint.read(host)
    assert back == claim and (back.owner, back.made, back.mps, back.device_sharing) == (
        1234, claim.made, daemon, {"GPU-1": mps})
    restarted = dataclasses.replace(claim, mps={**daemon, "process": {**daemon["process"], "pid": 4343}})
    checkpoint.save(host, [alloc("a"), restarted])
    assert len(journal_lines(host)) == 2 and checkpoint.read(host)[1].mps["process"]["pid"] == 4343
