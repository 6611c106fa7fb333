"""The NVML event edge (hostagent.devices.events) on simulated nodes."""

import pynvml
import pytest

from hostagent.devices.events import ECC_DBE, GPU_LOST, UNMONITORED, XID, EventSource
from hostagent.sim import control


def drain(source, want, timeout_ms=200, rounds=25):
    """Wait until ``want`` events arrived (or give up); returns them all."""
    out = []
    for _ in range(rounds):
        out += source.wait(timeout_ms)
        if len(out) >= want:
            break
    return out


def test_xid_ecc_and_instance_scope(make_node):
    host, store = make_node("dgx-a100")
    with EventSource(host) as source:
        assert source.open() == ()
        assert sorted(source.registered) == list(range(8))
        assert source.wait(50) == ()                         # timeout: nothing, no error
        control.inject_xid(store, 3, 48)
        control.inject_xid(store, 5, 94, gi=7, ci=0)
        control.inject_ecc(store, 1)
        got = drain(source, 3)
    uuids = {g.index: g.uuid for g in store.read().gpus}
    assert [(e.kind, e.gpu, e.uuid, e.xid, e.gi, e.ci) for e in got] == [
        (XID, 3, uuids[3], 48, None, None),
        (XID, 5, uuids[5], 94, 7, 0),
        (ECC_DBE, 1, uuids[1], None, None, None)]


def test_close_frees_the_event_set(make_node):
    host, _ = make_node("t4x2")
    source = EventSource(host)
    source.open()
    lib = pynvml.nvmlLib
    assert len(lib._event_sets) == 1
    source.close()
    assert lib._event_sets == {} and lib.calls["nvmlEventSetFree"] == 1
    with pytest.raises(RuntimeError):
        source.wait(10)


def test_registration_refused_is_unmonitored(make_node):
    host, store = make_node("t4x2")
    control.set_event_support(store, 1, False)
    with EventSource(host) as source:
        records = source.open()
        assert [(r.kind, r.gpu) for r in records] == [(UNMONITORED, 1)]
        assert "Not Supported" in records[0].detail and records[0].uuid
        assert sorted(source.registered) == [0]
        control.inject_xid(store, 0, 31)                    # GPU 0 is still watched
        assert [e.xid for e in drain(source, 1)] == [31]


def test_lost_gpu_then_others_still_watched(make_node):
    host, store = make_node("a30x4")
    with EventSource(host) as source:
        source.open()
        generation = source.generation
        control.lose_gpu(store, 2)
        got = drain(source, 2)
        assert [(e.kind, e.gpu, e.xid) for e in got] == [(XID, 2, 79), (GPU_LOST, 2, None)]
        assert sorted(source.registered) == [0, 1, 3] and source.generation > generation
        control.inject_xid(store, 3, 63)
        assert [(e.kind, e.gpu, e.xid) for e in drain(source, 1)] == [(XID, 3, 63)]


def test_gpu_lost_before_start(make_node):
    host, store = make_node("t4x2")
    control.lose_gpu(store, 0)
    with EventSource(host) as source:
        assert [(r.kind, r.gpu) for r in source.open()] == [(GPU_LOST, 0)]
        assert sorted(source.registered) == [1]
