"""Fan-out and the health state machine, on hand-made inventories (no NVML)."""

import dataclasses

import pytest

from hostagent.devices.events import KINDS as RAW_KINDS
from hostagent.devices.events import RawEvent
from hostagent.devices.records import (Gpu, Inventory, MigDevice, MigState, Placement,
                                       UnreadableGpu)
from hostagent.errors import NotFoundError
from hostagent.health import KINDS, DeviceIndex, XidPolicy, annotate, to_health_event
from hostagent.health import state as S
from hostagent.health.view import describe, rows

P = Placement(0, 1)


def mig(gpu, slot, gi, ci, profile="1g.5gb"):
    return MigDevice(uuid=f"MIG-{gpu}-{gi}-{ci}", parent_index=gpu, parent_uuid=f"GPU-{gpu}",
                     parent_minor=gpu, index=slot, gi=gi, ci=ci, profile=profile, gi_profile_id=19,
                     ci_profile_id=0, placement=P, ci_placement=P, memory_mib=4864,
                     multiprocessors=14, copy_engines=1, decoders=0, encoders=0, jpegs=0, ofas=0)


def gpu(index, devices=(), gis=()):
    state = MigState(enabled=bool(devices), pending=bool(devices), profiles=(),
                     gpu_instances=tuple(gis), devices=tuple(devices))
    return Gpu(index=index, minor=index, uuid=f"GPU-{index}", name="NVIDIA A100-SXM4-40GB",
               serial=None, memory_mib=40960, pci_bus_id=f"00000000:0{index}:00.0",
               pci_device_id=0x20B010DE, compute_capability="8.0", architecture="ampere", mig=state)


def inventory(*gpus, unreadable=()):
    return Inventory(driver_version="550.90.07", cuda_driver_version="12.4", nvml_version="12.550",
                     gpus=tuple(gpus), unreadable=tuple(unreadable))


# GPU 0: GI 7 (one CI) and GI 1 with two compute instances (a 3g split 1c+2c); GPU 1 whole.
INV = inventory(gpu(0, [mig(0, 6, 7, 0), mig(0, 0, 1, 0, "1c.3g.20gb"), mig(0, 1, 1, 1, "2c.3g.20gb")]),
                gpu(1))
INDEX = DeviceIndex.from_inventory(INV)
ALL0 = ("GPU-0", "MIG-0-7-0", "MIG-0-1-0", "MIG-0-1-1")


def raw(kind="xid", g=0, xid=48, gi=None, ci=None, at=100.0, detail=""):
    return RawEvent(kind, g, f"GPU-{g}", at, xid=xid if kind == "xid" else None, gi=gi, ci=ci,
                    detail=detail)


def event(policy=XidPolicy(), allocations=None, **kw):
    return to_health_event(raw(**kw), INDEX, policy, allocations)


def test_kinds_match_the_event_edge():
    assert KINDS == RAW_KINDS


@pytest.mark.parametrize("gi, ci, want, unresolved", [
    (None, None, ALL0, False),                         # GPU-wide: the GPU and every MIG device
    (7, 0, ("MIG-0-7-0",), False),                     # scoped: only that instance
    (1, None, ("MIG-0-1-0", "MIG-0-1-1"), False),      # GI named, no CI: every CI of the GI
    (1, 1, ("MIG-0-1-1",), False),
    (9, 0, ("GPU-0",), True),                          # unknown instance: kept on the GPU only
])
def test_fan_out(gi, ci, want, unresolved):
    ev = event(gi=gi, ci=ci)
    assert ev.devices == want and ev.unresolved is unresolved


def test_fan_out_reaches_every_allocation():
    allocs = {"GPU-0": ["whole"], "MIG-0-7-0": ["a", "b"], "MIG-0-1-1": ["c", "a"]}
    ev = event(allocations=lambda key: allocs.get(key, ()))
    assert ev.allocations == ("whole", "a", "b", "c")      # replicas too, each once
    assert event(gi=7, ci=0, allocations=lambda key: allocs.get(key, ())).allocations == ("a", "b")


def test_ignored_xid_is_recorded_not_unhealthy():
    st = S.initial(INDEX, 0.0)
    ev = event(xid=13)
    assert ev.ignored and not ev.critical
    st2, changed = S.apply_event(st, ev, quiet_period=60, now=100.0)
    assert {d.key for d in changed} == set(ALL0)
    assert all(d.healthy and d.last_xid == 13 and d.state == "healthy" for d in changed)
    assert st2.revision == st.revision + 1 and not st2.unhealthy


def test_an_ignored_xid_is_a_notice_for_the_quiet_period():
    st = S.initial(INDEX, 0.0)
    st, changed = S.apply_event(st, event(xid=13, at=100.0), quiet_period=60, now=100.0)
    assert all(d.healthy and d.notice.xid == 13 and d.notice_until == 160.0 for d in changed)
    assert S.next_due(st) == 160.0
    # a counted XID after it: unhealthy, the notice kept beside the reason
    st, _ = S.apply_event(st, event(g=0, xid=48, at=120.0), quiet_period=60, now=120.0)
    assert st.get("GPU-0").notice.xid == 13 and not st.get("GPU-0").healthy
    st, changed = S.recover_due(st, 160.0)
    assert {d.key for d in changed} == set(ALL0)
    assert all(d.notice is None and d.notice_until is None for d in st.devices.values())
    assert {d.key for d in st.unhealthy} == set(ALL0)          # 48 recovers at 180
    # a new MIG device of the GPU takes its GPU-wide notice; a clear drops it
    st, _ = S.apply_event(st, event(xid=43, at=200.0), quiet_period=60, now=200.0)
    grown = DeviceIndex.from_inventory(inventory(gpu(0, [mig(0, 6, 7, 0), mig(0, 3, 2, 0)]), gpu(1)),
                                       st.devices.values())
    st, _ = S.reconcile(st, grown, now=201.0)
    assert st.get("MIG-0-2-0").notice.xid == 43 and st.get("MIG-0-2-0").notice_until == 260.0
    st, changed = S.clear(st, ["0"], now=202.0)
    assert all(d.notice is None for d in changed)
    # without a quiet period it stays until cleared; a policy that counts it drops it
    st, _ = S.apply_event(st, event(xid=13, at=300.0), quiet_period=None, now=300.0)
    assert st.get("GPU-0").notice_until is None and S.recover_due(st, 1e12)[1] == ()
    assert S.rebase(st, XidPolicy(), 30, now=301.0)[0].get("GPU-0").notice_until == 330.0
    assert S.rebase(st, XidPolicy.from_lists([], [13]), None, now=301.0)[0].get("GPU-0").notice is None


def test_critical_xid_then_quiet_recovery():
    st = S.initial(INDEX, 0.0)
    st, changed = S.apply_event(st, event(xid=48, at=100.0), quiet_period=60, now=100.0)
    assert {d.key for d in st.unhealthy} == set(ALL0)
    assert all(d.recover_at == 160.0 and d.changed_at == 100.0 for d in changed)
    assert S.next_due(st) == 160.0
    # another error on one instance extends only that instance's quiet period
    st, _ = S.apply_event(st, event(xid=94, gi=7, ci=0, at=130.0), quiet_period=60, now=130.0)
    assert st.get("MIG-0-7-0").recover_at == 190.0 and st.get("GPU-0").recover_at == 160.0
    assert [str(r) for r in st.get("MIG-0-7-0").reasons] == ["XID 48", "XID 94 (instance)"]
    same, changed = S.recover_due(st, 159.9)
    assert same is st and changed == ()
    st, changed = S.recover_due(st, 160.0)
    assert {d.key for d in changed} == {"GPU-0", "MIG-0-1-0", "MIG-0-1-1"}
    assert {d.key for d in st.unhealthy} == {"MIG-0-7-0"}
    st, changed = S.recover_due(st, 190.0)
    assert not st.unhealthy and changed[0].reasons == () and changed[0].changed_at == 190.0


def test_no_quiet_period_means_until_cleared():
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(kind="ecc_dbe", at=5.0), quiet_period=None, now=5.0)
    assert all(d.recover_at is None for d in st.unhealthy) and len(st.unhealthy) == 4
    assert S.recover_due(st, 1e12)[1] == ()


def test_gpu_lost_is_sticky():
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(xid=79, at=1.0), quiet_period=10, now=1.0)
    st, _ = S.apply_event(st, event(kind="gpu_lost", at=2.0), quiet_period=10, now=2.0)
    assert all(d.recover_at is None for d in st.unhealthy)
    assert S.recover_due(st, 1e9)[1] == ()
    assert all(d.lost and not d.monitored and d.monitor_detail == S.LOST_DETAIL for d in st.unhealthy)
    st, changed = S.clear(st, ["0"], now=3.0)             # a GPU clears its MIG devices too
    assert {d.key for d in changed} == set(ALL0) and not st.unhealthy
    # nothing watches a lost GPU: cleared, it is unmonitored, never "healthy"
    assert {d.state for d in changed} == {"unmonitored"} and all(d.lost for d in changed)
    # a new NVML session seeing it lost again does not undo the clear
    st2, changed = S.apply_event(st, event(kind="gpu_lost", at=4.0), quiet_period=10, now=4.0)
    assert not st2.unhealthy and {d.state for d in st2.devices.values() if d.gpu == 0} == {"unmonitored"}
    # registered again (NVML reads it after a reset): watched, no longer lost
    st3, changed = S.set_monitored(st2, [0], now=5.0)
    assert {d.state for d in changed} == {"healthy"} and not any(d.lost for d in changed)


def test_lost_gpu_keeps_its_identity_across_inventory_reads():
    """Once lost, NVML cannot read the GPU: the inventory has only its index. Its records
    stay under its UUID (and its MIG devices'), unhealthy, at every later read."""
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(kind="gpu_lost", at=1.0), quiet_period=10, now=1.0)
    lost = inventory(gpu(1), unreadable=[UnreadableGpu(index=0, error="GPU is lost", nvml_code=15)])
    for now in (2.0, 3.0, 4.0):                           # re-reads, each from the records before
        index = DeviceIndex.from_inventory(lost, st.devices.values())
        st, changed = S.reconcile(st, index, now=now)
        assert changed == ()
    assert list(st.devices) == [*ALL0, "GPU-1"]
    assert {d.state for d in st.unhealthy} == {"unhealthy"} and {d.key for d in st.unhealthy} == set(ALL0)
    assert all(r.sticky for r in st.get("GPU-0").reasons)
    ev = to_health_event(RawEvent("gpu_lost", 0, None, 5.0), index, XidPolicy())
    assert ev.devices == ALL0 and ev.gpu_uuid == "GPU-0"
    # read again (after a reset) with another layout: the inventory's devices are followed
    back = DeviceIndex.from_inventory(inventory(gpu(0), gpu(1)), st.devices.values())
    assert [r.key for r in back.refs()] == ["GPU-0", "GPU-1"]


def test_rebase_follows_a_new_policy_and_quiet_period():
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(xid=48, at=10.0), quiet_period=None, now=10.0)
    st, _ = S.apply_event(st, event(xid=94, gi=7, ci=0, at=20.0), quiet_period=None, now=20.0)
    st, _ = S.apply_event(st, event(g=1, kind="ecc_dbe", at=30.0), quiet_period=None, now=30.0)
    # same settings: nothing changes, health and last XIDs carry over as they were
    assert S.rebase(st, XidPolicy(), None, now=40.0) == (st, ())
    # 48 ignored now: only the instance's own XID 94 is left; ECC is no XID
    st2, changed = S.rebase(st, XidPolicy.from_lists([48]), None, now=40.0)
    assert {d.key for d in st2.unhealthy} == {"MIG-0-7-0", "GPU-1"}
    assert [str(r) for r in st2.get("MIG-0-7-0").reasons] == ["XID 94 (instance)"]
    healed = st2.get("GPU-0")
    assert healed.healthy and healed.changed_at == 40.0 and healed.last_xid == 48
    # a quiet period now: recoveries due from the reasons' times
    st3, _ = S.rebase(st, XidPolicy(), 60, now=40.0)
    assert st3.get("GPU-0").recover_at == 70.0 and st3.get("MIG-0-7-0").recover_at == 80.0
    assert st3.get("GPU-1").recover_at == 90.0 and len(st3.unhealthy) == 5


def test_clear_named_devices_and_all():
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(at=1.0), quiet_period=None, now=1.0)
    st, _ = S.apply_event(st, event(g=1, at=1.0), quiet_period=None, now=1.0)
    st2, changed = S.clear(st, ["0:6"], now=2.0)           # by name, as hostagent devices shows it
    assert [d.key for d in changed] == ["MIG-0-7-0"]
    st2, changed = S.clear(st2, ["GPU-1"], now=2.0)        # by UUID
    assert [d.key for d in changed] == ["GPU-1"]
    with pytest.raises(NotFoundError):
        S.clear(st2, ["7"], now=2.0)
    st3, changed = S.clear(st2, None, now=3.0)
    assert not st3.unhealthy and len(changed) == 3
    assert S.clear(st3, None, now=4.0) == (st3, ())        # nothing to do: no new revision


def test_unmonitored_is_not_healthy_and_comes_back():
    st = S.initial(INDEX, 0.0)
    ev = event(kind="unmonitored", g=0, detail="event registration: Not Supported")
    st, changed = S.apply_event(st, ev, quiet_period=60, now=1.0)
    assert {d.state for d in changed} == {"unmonitored"} and len(changed) == 4
    assert st.get("GPU-1").state == "healthy"
    # an XID while unmonitored (seen another way) still makes it unhealthy: that wins
    st, _ = S.apply_event(st, event(xid=48, at=2.0), quiet_period=60, now=2.0)
    assert st.get("GPU-0").state == "unhealthy"
    st, changed = S.set_monitored(st, [0], now=3.0)
    assert all(d.monitored for d in changed) and st.get("GPU-0").state == "unhealthy"
    assert S.set_monitored(st, [0, 1], now=4.0)[1] == ()


def test_reconcile_follows_mig_changes():
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(xid=48, at=1.0), quiet_period=60, now=1.0)       # GPU-wide
    st, _ = S.apply_event(st, event(xid=94, gi=7, ci=0, at=2.0), quiet_period=60, now=2.0)
    # GI 1 destroyed, GI 2 created on GPU 0
    new = DeviceIndex.from_inventory(inventory(gpu(0, [mig(0, 6, 7, 0), mig(0, 4, 2, 0)]), gpu(1)))
    st2, changed = S.reconcile(st, new, now=3.0)
    assert list(st2.devices) == ["GPU-0", "MIG-0-7-0", "MIG-0-2-0", "GPU-1"]
    fresh = st2.get("MIG-0-2-0")
    assert [d.key for d in changed] == ["MIG-0-2-0"]
    assert not fresh.healthy and [str(r) for r in fresh.reasons] == ["XID 48"]   # GPU-wide only
    assert fresh.recover_at == 61.0
    assert st2.get("MIG-0-7-0") == st.get("MIG-0-7-0")                           # history kept
    assert S.reconcile(st2, new, now=4.0)[0] is st2


def test_a_gpu_out_of_the_inventory_and_back_keeps_its_health():
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(g=1, xid=48, at=1.0), quiet_period=60, now=1.0)
    bad = st.get("GPU-1")
    # Passed through: NVML no longer lists it (and a GPU after it would take its index).
    st, _ = S.reconcile(st, DeviceIndex.from_inventory(inventory(gpu(0))), now=2.0)
    assert "GPU-1" not in st.devices and not st.unhealthy
    assert S.recover_due(st, now=100.0)[0].away == st.away        # out of the inventory, not looked at
    # Bound back: the same record, under the name it has now; its quiet period ran meanwhile.
    st, changed = S.reconcile(st, DeviceIndex.from_inventory(inventory(gpu(0), gpu(1))), now=3.0)
    assert st.get("GPU-1") == bad and not st.away
    assert [d.key for d in S.recover_due(st, now=62.0)[1]] == ["GPU-1"]
    # Cleared, all of them, while it is away: healthy when it returns. MIG devices and
    # unreadable GPUs are never set aside (their UUIDs never return, their keys are indices).
    st, _ = S.reconcile(st, DeviceIndex.from_inventory(inventory(gpu(0))), now=4.0)
    st, _ = S.clear(st, None, now=5.0)
    st, _ = S.reconcile(st, DeviceIndex.from_inventory(inventory(gpu(0), gpu(1))), now=6.0)
    assert st.get("GPU-1").healthy
    st = S.initial(INDEX, 0.0)
    st, _ = S.reconcile(st, DeviceIndex.from_inventory(inventory(gpu(0), gpu(1))), now=1.0)
    assert not st.away


def test_unreadable_gpu_has_a_record():
    inv = inventory(gpu(0), unreadable=[UnreadableGpu(index=1, error="GPU is lost", nvml_code=15)])
    index = DeviceIndex.from_inventory(inv)
    st = S.initial(index, 0.0)
    assert list(st.devices) == ["GPU-0", "gpu:1"]
    ev = to_health_event(RawEvent("gpu_lost", 1, None, 1.0), index, XidPolicy())
    assert ev.devices == ("gpu:1",) and ev.gpu_uuid is None
    st, _ = S.apply_event(st, ev, quiet_period=60, now=1.0)
    assert st.get("gpu:1").state == "unhealthy"


def test_annotate_and_rows():
    st = S.initial(INDEX, 0.0)
    st, _ = S.apply_event(st, event(xid=94, gi=7, ci=0, at=10.0), quiet_period=60, now=10.0)
    from hostagent import model
    listing = annotate(model.device_list(model.inventory_devices(INV).values(), INV), st)
    g0 = listing["gpus"][0]
    assert g0["health"]["state"] == "healthy"
    by_uuid = {d["uuid"]: d["health"] for d in listing["mig_devices"]}
    assert by_uuid["MIG-0-7-0"] == {"state": "unhealthy", "since": 10.0, "reasons": ["XID 94 (instance)"],
                                    "last_xid": 94, "recover_at": 70.0}
    assert by_uuid["MIG-0-1-0"]["state"] == "healthy"
    table = {r[0]: r for r in rows(st, now=40.0)}
    assert table["0:6"][2:] == ["unhealthy", "XID 94 (instance)", 94, "30s ago", "in 30s"]
    assert dataclasses.asdict(st.get("GPU-1"))["healthy"] is True


def test_describe_for_api_records():
    st = S.initial(INDEX, 0.0)
    assert describe(st.get("GPU-1")) == ("healthy", "no XID, ECC or lost-GPU problem pending")
    st, _ = S.apply_event(st, event(xid=48, at=1.0), quiet_period=None, now=1.0)
    st, _ = S.apply_event(st, event(kind="gpu_lost", at=2.0), quiet_period=None, now=2.0)
    assert describe(st.get("GPU-0")) == ("gpu_lost", "XID 48, gpu lost; until cleared")
    st, _ = S.apply_event(st, event(g=1, kind="unmonitored", detail="event registration: Not Supported"),
                          quiet_period=None, now=3.0)
    assert describe(st.get("GPU-1")) == ("unmonitored", "event registration: Not Supported")
