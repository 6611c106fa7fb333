"""Revisions never repeat, even across restarts and crashes; the ring answers resumptions
exactly or asks for a snapshot."""

import json

from hostagent.daemon.events import EventLog, RevisionClock


def test_revisions_survive_restarts_without_reuse(tmp_path):
    path = tmp_path / "revision"
    first = RevisionClock(path, block=10)
    seen = [first.next() for _ in range(25)]           # crosses two block boundaries
    assert seen == list(range(1, 26))
    assert int(path.read_text()) == 30
    # A crash now (no clean shutdown): the next run starts above anything reserved.
    second = RevisionClock(path, block=10)
    assert second.current == 30 and second.next() == 31
    assert RevisionClock(tmp_path / "missing", block=10).current == 0


def test_event_log_resumption_and_snapshot_cases():
    log = EventLog(RevisionClock(None), capacity=4)
    assert log.after(0) == [] and log.after(1) is None          # nothing yet; a future revision
    revs = [log.publish("x", {"i": i}) for i in range(6)]
    assert revs == [1, 2, 3, 4, 5, 6]
    assert log.oldest == 2                                    # ring holds 3..6
    assert [json.loads(line)["i"] for line in log.after(2)] == [2, 3, 4, 5]
    assert [json.loads(line)["revision"] for line in log.after(4)] == [5, 6]
    assert log.after(6) == []
    assert log.after(1) is None and log.after(7) is None      # too old; never published
    line = json.loads(log.after(5)[0])
    assert line["type"] == "x" and line["revision"] == 6 and "time" in line


def test_the_ring_keeps_at_most_its_bytes_and_always_the_newest_event():
    log = EventLog(RevisionClock(None), capacity=100, max_bytes=2000)
    small = [log.publish("x", {"i": i}) for i in range(5)]
    big = log.publish("allocation_created", {"edits": "e" * 900})      # two of these fill the budget
    log.publish("allocation_created", {"edits": "e" * 900})
    assert log.bytes == sum(len(line) for line in log.after(log.oldest)) <= 2000
    assert log.oldest >= small[-1] and log.after(small[0]) is None  # the small ones fell out: snapshot
    assert [json.loads(line)["revision"] for line in log.after(big - 1)] == [big, big + 1]
    huge = log.publish("allocation_created", {"edits": "e" * 5000})    # alone over the budget: kept
    assert log.after(huge - 1) and log.oldest == huge - 1
    log.resize(50)
    assert log.bytes == sum(len(line) for line in log.after(log.oldest))


def test_payload_sees_its_own_revision():
    log = EventLog(RevisionClock(None))
    rev = log.publish("device_changed", lambda r: {"device": {"revision": r}})
    assert json.loads(log.after(0)[0])["device"]["revision"] == rev == 1


def test_resize_keeps_the_newest():
    log = EventLog(RevisionClock(None), capacity=8)
    for i in range(8):
        log.publish("x")
    log.resize(3)
    assert log.oldest == 5 and len(log.after(5)) == 3


def test_rendered_payload_values_go_into_the_line_as_they_are():
    from hostagent.daemon.events import Rendered
    log = EventLog(RevisionClock(None))
    view = {"id": "a", "container_edits": {"env": ["X=1"]}}
    rev = log.publish("allocation_deleted", {"reason": "released", "allocation": Rendered(json.dumps(view).encode())})
    event = json.loads(log.after(0)[0])
    assert event == {"type": "allocation_deleted", "revision": rev, "time": event["time"], "reason": "released",
                     "allocation": view}


def test_events_after_a_revision_of_some_types_only():
    log = EventLog(RevisionClock(None))
    for type_ in ("allocation_created", "device_changed", "allocation_deleted", "device_changed"):
        log.publish(type_, {})
    assert [json.loads(line)["revision"] for line in log.after(0, frozenset({"device_changed"}))] == [2, 4]
    assert log.after(2, frozenset({"node_changed"})) == [] and len(log.after(2)) == 2


def test_device_changes_only_in_own_allocations_left_out_for_their_owner():
    log = EventLog(RevisionClock(None))
    log.publish("device_changed", {"i": 1}, moved=frozenset({"mine/a"}))
    log.publish("device_changed", {"i": 2}, moved=frozenset({"mine/a", "dra/claim"}))   # also another's
    log.publish("device_changed", {"i": 3})                                            # more than allocations
    log.publish("allocation_created", {"i": 4})
    assert [json.loads(line)["i"] for line in log.after(0, own="mine/")] == [2, 3, 4]
    assert [json.loads(line)["i"] for line in log.after(0, own="other/")] == [1, 2, 3, 4]
    assert [json.loads(line)["i"] for line in log.after(0)] == [1, 2, 3, 4]
