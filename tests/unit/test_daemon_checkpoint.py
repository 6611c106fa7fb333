"""The allocations checkpoint: a snapshot and a journal of changes, read back as the last set
saved whatever a crash left (a half-written line, a snapshot not yet followed by the
journal's emptying), and rewritten whole when another writer came between."""

import dataclasses
import json
import os
from pathlib import Path

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
    """The journal's changes (not its first line, which names it)."""
    lines = checkpoint.journal_path(host).read_bytes().splitlines(keepends=True)
    return lines[1:] if lines and lines[0].startswith(b'{"journal":') else lines


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
    assert ids(host) == ["a", "b"]                                    # and not damage either
    checkpoint._writers.clear()                                       # the daemon starts again
    assert [a.id for a in checkpoint.load(host)] == ["a", "b"] and checkpoint.unreadable(host) == []
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


GPU = ["GPU-00000000-0000-0000-0000-00000000000%d" % i for i in range(4)]


def test_a_damaged_journal_line_is_set_aside_and_the_rest_kept(host):
    """A whole line that is not a change (damage, not a crash: a crash cuts only the last
    line) is set aside with the devices its text names; the lines after it still apply."""
    checkpoint.save(host, [alloc("a", GPU[0])])
    checkpoint.save(host, [alloc("a", GPU[0]), alloc("b", GPU[1])])
    with open(checkpoint.journal_path(host), "ab") as f:
        f.write(b'{"put":[{"id":"c","devices":["' + GPU[2].encode() + b'"]\x00garbage\n')
        f.write(b'{"put":[],"drop":["a"]}\n')
    with pytest.raises(ValueError, match="journal line 3 is not JSON"):
        checkpoint.read(host)                            # the CLI refuses to guess
    before = checkpoint.journal_path(host).read_bytes()
    checkpoint._writers.clear()
    assert [a.id for a in checkpoint.load(host)] == ["b"]
    [record] = checkpoint.unreadable(host)
    assert record.devices == (GPU[2],) and record.reason == "journal line 3 is not JSON"
    assert Path(record.kept_as).read_bytes() == before and Path(record.kept_as).parent == host.state_dir
    assert checkpoint.held_devices([record]) == {GPU[2]}
    # Rewritten whole: the next start reads it clean, and the record stays until dismissed.
    assert ids_after_restart(host) == ["b"] and checkpoint.unreadable(host) == [record]
    with pytest.raises(ValueError, match="1 unreadable record"):
        checkpoint.read(host)
    assert checkpoint.dismiss(host) == [record] and checkpoint.unreadable(host) == [] and ids(host) == ["b"]


def test_a_load_in_the_process_that_saved_lets_go_of_its_journal(host):
    """The writer's descriptor of the journal set aside is closed, not leaked."""
    checkpoint.save(host, [alloc("a", GPU[0])])
    fd = checkpoint._writers[str(checkpoint.path(host))].fd
    with open(checkpoint.journal_path(host), "ab") as f:
        f.write(b'{"put":[],"drop":[7]}\n')
    assert [a.id for a in checkpoint.load(host)] == ["a"]
    [record] = checkpoint.unreadable(host)
    assert record.reason == "journal line 2 drops an id that is not a string" and record.devices is None
    with pytest.raises(OSError):
        os.fstat(fd)
    checkpoint.save(host, [alloc("a", GPU[0]), alloc("b", GPU[1])])
    assert ids_after_restart(host) == ["a", "b"]


def ids_after_restart(host) -> list[str]:
    checkpoint._writers.clear()
    return [a.id for a in checkpoint.load(host)]


def test_a_damaged_snapshot_keeps_each_entry_it_can_read(host):
    checkpoint.save(host, [alloc("a", GPU[0]), alloc("b", GPU[1]), alloc("c", GPU[2])])
    text = checkpoint.path(host).read_bytes()
    lines = text.split(b"\n")
    lines[2] = lines[2][:25] + b"\xff\xfe" + lines[2][27:]            # entry b damaged on disk
    checkpoint.path(host).write_bytes(b"\n".join(lines))
    assert ids_after_restart(host) == ["a", "c"]
    [record] = checkpoint.unreadable(host)
    assert record.devices == (GPU[1],) and "line 3 is not an allocation" in record.reason
    assert Path(record.kept_as).read_bytes() == b"\n".join(lines)
    assert json.loads(checkpoint.path(host).read_text())["version"] == checkpoint.VERSION


def test_an_entry_that_is_no_allocation_holds_what_it_names(host):
    checkpoint.save(host, [alloc("a", GPU[0])])
    with open(checkpoint.journal_path(host), "ab") as f:
        f.write(b'{"put":[{"id":"odd","devices":["' + GPU[3].encode() + b'"]}],"drop":[]}\n')   # no request
    assert ids_after_restart(host) == ["a"]
    [record] = checkpoint.unreadable(host)
    assert record.devices == (GPU[3],) and "allocation 'odd' cannot be read" in record.reason


def test_a_record_that_names_no_device_may_hold_any(host):
    checkpoint.save(host, [alloc("a", GPU[0])])
    checkpoint.path(host).write_bytes(b'{"version":1,"allocations":[\n\x00\x01\x02\n]}\n')
    assert ids_after_restart(host) == []
    [record] = checkpoint.unreadable(host)
    assert record.devices is None and checkpoint.held_devices([record]) is None


def test_a_checkpoint_of_another_version_is_kept_whole(host):
    newer = {"version": 2, "allocations": [{"id": "x", "devices": [GPU[1]]}]}
    ensure = host.state_dir
    ensure.mkdir(parents=True, exist_ok=True)
    checkpoint.path(host).write_text(json.dumps(newer))
    assert ids_after_restart(host) == []
    [record] = checkpoint.unreadable(host)
    assert "unknown checkpoint version 2" in record.reason and record.devices == (GPU[1],)
    assert json.loads(Path(record.kept_as).read_text()) == newer


def test_a_crash_in_the_set_aside_records_it_once(host, monkeypatch):
    """Killed after the record, before the rewrite: the next start finds the same damage
    again, and records it once."""
    checkpoint.save(host, [alloc("a", GPU[0])])
    with open(checkpoint.journal_path(host), "ab") as f:
        f.write(b'not a change ' + GPU[1].encode() + b'\n')
    checkpoint._writers.clear()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")
    real = checkpoint.write_atomic
    monkeypatch.setattr(checkpoint, "write_atomic", lambda p, *a, **k: killed() if p == checkpoint.path(host)
                        else real(p, *a, **k))
    with pytest.raises(KeyboardInterrupt):
        checkpoint.load(host)
    monkeypatch.setattr(checkpoint, "write_atomic", real)
    assert len(checkpoint.unreadable(host)) == 1
    assert ids_after_restart(host) == ["a"] and len(checkpoint.unreadable(host)) == 1


def test_nothing_is_refused_for_its_size_and_the_journal_is_compacted_by_size(host, monkeypatch):
    """What a flood of large allocations made: a journal past what any bound would allow is
    read whole; and a writer snapshots once its journal holds COMPACT_BYTES."""
    big = {"labels": {"k": "x" * 60000}}
    entry = lambda i: Allocation(f"f{i}", (GPU[1],), {"id": f"f{i}", "devices": [], **big}, 1.0)
    checkpoint.save(host, [alloc("root", GPU[0])])
    with open(checkpoint.journal_path(host), "ab") as f:            # as an earlier version let it grow
        for i in range(160):
            f.write(b'{"put":[' + entry(i).checkpoint_json.encode() + b'],"drop":[]}\n')
            f.write(b'{"put":[],"drop":["f%d"]}\n' % i)
    assert checkpoint.journal_path(host).stat().st_size > 9 << 20
    assert ids_after_restart(host) == ["root"] and checkpoint.unreadable(host) == []
    monkeypatch.setattr(checkpoint, "COMPACT_BYTES", 200_000)
    checkpoint._writers.clear()
    checkpoint.save(host, [alloc("root", GPU[0])])                   # a snapshot, the journal emptied
    sizes = []
    for i in range(8):
        checkpoint.save(host, [alloc("root", GPU[0]), entry(i)])
        checkpoint.save(host, [alloc("root", GPU[0])])
        sizes.append(checkpoint.journal_path(host).stat().st_size)
    assert max(sizes) < 200_000 + 70_000 and min(sizes) < 100, sizes   # 4 lines of 60 KB, then a snapshot
    assert ids(host) == ["root"]


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


def test_a_crash_between_a_compaction_and_its_journals_emptying_loses_nothing(host, monkeypatch):
    """The journal's lines are older than the snapshot written after them: one that dropped
    an allocation made again since (held by the snapshot) must not drop it."""
    checkpoint.save(host, [alloc("a", GPU[0])])
    checkpoint.save(host, [alloc("a", GPU[0]), alloc("x", GPU[1])])
    checkpoint.save(host, [alloc("a", GPU[0])])                               # x dropped: a line
    checkpoint._writers.clear()                                            # the daemon starts again
    monkeypatch.setattr(checkpoint.faults, "point", lambda name: (_ for _ in ()).throw(KeyboardInterrupt(name))
                        if name == "checkpoint:after_snapshot" else None)
    with pytest.raises(KeyboardInterrupt):                                  # killed after the snapshot
        checkpoint.save(host, [alloc("a", GPU[0]), alloc("x", GPU[2], created=9.0)])
    assert len(journal_lines(host)) == 2                                   # the old lines are still there
    assert [(a.id, a.devices, a.created) for a in checkpoint.read(host)] == [
        ("a", (GPU[0],), 1.0), ("x", (GPU[2],), 9.0)]
