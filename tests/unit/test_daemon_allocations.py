"""Allocation rules, pure: normalisation, named and constrained selection, best fit,
sharing and conflicts."""

import pytest

from hostagent.daemon.allocations import (AllocationConflict, Candidate, DeviceBusy,
                                          DeviceNotAllocatable, InsufficientDevices,
                                          ShareLimitReached, UnknownDevice, normalize, select)
from hostagent.errors import UsageError


def cand(uuid, name, kind="gpu", memory=40960, profile=None, cc="8.0", product="NVIDIA A100-SXM4-40GB",
         why=None, order=0):
    return Candidate(uuid, name, kind, product, memory, cc, profile, (order,), why)


NODE = [cand("G0", "0", why="MIG is enabled: allocate its MIG devices", order=0),
        cand("M0", "0:1", "mig", 4864, "1g.5gb", order=1),
        cand("M1", "0:2", "mig", 4864, "1g.5gb", order=2),
        cand("M2", "0:3", "mig", 19968, "3g.20gb", order=3),
        cand("G1", "1", order=4), cand("G2", "2", order=5),
        cand("T0", "3", memory=15360, cc="7.5", product="Tesla T4", order=6)]
NAMES = {c.name: c.uuid for c in NODE} | {c.uuid: c.uuid for c in NODE}


def pick(body, users=None, unhealthy=()):
    return select(normalize(body), NODE, users or {}, NAMES.get, lambda u: u not in unhealthy)


def test_normalize_defaults_and_cross_field_rules():
    n = normalize({"id": "a", "devices": [{"device": " 1 "}, {"constraints": {"profile": "1g.5gb"}}]})
    assert n["devices"] == [{"device": "1"}, {"constraints": {"profile": "1g.5gb", "type": "mig"}, "count": 1}]
    assert n["sharing"] == {"strategy": "Exclusive"}
    ts = normalize({"id": "a", "devices": [{"device": "1"}], "sharing": {"strategy": "TimeSlicing"}})
    assert ts["sharing"]["timeSlicingConfig"] == {"interval": "Default"}
    for bad in ({"strategy": "TimeSlicing", "mpsConfig": {}}, {"strategy": "MPS", "timeSlicingConfig": {}},
                {"mpsConfig": {}}):
        with pytest.raises(UsageError):
            normalize({"id": "a", "devices": [{"device": "1"}], "sharing": bad})
    with pytest.raises(UsageError):
        normalize({"id": "a", "devices": [{"constraints": {"profile": "1g.5gb", "type": "gpu"}}]})
    with pytest.raises(UsageError):
        normalize({"id": "-a", "devices": [{"device": "1"}]})


def test_named_devices():
    assert pick({"id": "a", "devices": [{"device": "2"}, {"device": "M0"}]}) == ["G2", "M0"]
    with pytest.raises(UnknownDevice):
        pick({"id": "a", "devices": [{"device": "9"}]})
    with pytest.raises(DeviceNotAllocatable):
        pick({"id": "a", "devices": [{"device": "0"}]})
    with pytest.raises(DeviceNotAllocatable):
        pick({"id": "a", "devices": [{"device": "1"}]}, unhealthy={"G1"})
    with pytest.raises(UsageError):
        pick({"id": "a", "devices": [{"device": "1"}, {"device": "G1"}]})


def test_constraints_best_fit():
    assert pick({"id": "a", "devices": [{"constraints": {"min_memory_mib": 10000}}]}) == ["T0"]
    assert pick({"id": "a", "devices": [{"constraints": {"min_memory_mib": 16000}}]}) == ["M2"]
    assert pick({"id": "a", "devices": [{"constraints": {"min_memory_mib": 1}}]}) == ["M0"]
    assert pick({"id": "a", "devices": [{"constraints": {"type": "gpu"}, "count": 2}]}) == ["T0", "G1"]
    assert pick({"id": "a", "devices": [{"constraints": {"type": "gpu", "compute_capability": "8.0"}}]}) == ["G1"]
    assert pick({"id": "a", "devices": [{"constraints": {"product": "t4"}}]}) == ["T0"]
    assert pick({"id": "a", "devices": [{"device": "M0"}, {"constraints": {"profile": "1g.5gb"}}]}) == ["M0", "M1"]
    with pytest.raises(InsufficientDevices) as e:
        pick({"id": "a", "devices": [{"constraints": {"profile": "1g.5gb"}, "count": 3}]})
    assert e.value.details["matching"] == 2 and e.value.details["available"] == 2


def test_sharing_and_conflicts():
    users = {"G1": [("other", "Exclusive")], "G2": [("ts", "TimeSlicing")]}
    with pytest.raises(DeviceBusy):
        pick({"id": "a", "devices": [{"device": "1"}]}, users)
    with pytest.raises(DeviceBusy):
        pick({"id": "a", "devices": [{"device": "1"}], "sharing": {"strategy": "TimeSlicing"}}, users)
    assert pick({"id": "a", "devices": [{"device": "2"}], "sharing": {"strategy": "TimeSlicing"}}, users) == ["G2"]
    with pytest.raises(DeviceBusy):
        pick({"id": "a", "devices": [{"device": "2"}], "sharing": {"strategy": "MPS"}}, users)
    # Shared constraint groups prefer the least shared device.
    got = pick({"id": "a", "devices": [{"constraints": {"type": "gpu", "product": "A100"}}],
                "sharing": {"strategy": "TimeSlicing"}}, {"G2": [("ts", "TimeSlicing")]})
    assert got == ["G1"]
    assert issubclass(AllocationConflict, Exception)


def test_shares_per_device_are_bounded():
    ts = {"strategy": "TimeSlicing"}
    users = {"G1": [("a", "TimeSlicing"), ("b", "TimeSlicing")], "G2": [("c", "TimeSlicing")]}

    def limited(body, limit):
        return select(normalize(body), NODE, users, NAMES.get, lambda u: True, max_per_device=limit)
    assert limited({"id": "x", "devices": [{"device": "1"}], "sharing": ts}, 3) == ["G1"]
    with pytest.raises(ShareLimitReached) as e:
        limited({"id": "x", "devices": [{"device": "1"}], "sharing": ts}, 2)
    assert e.value.details == {"device": "G1", "limit": 2} and e.value.code == "share_limit_reached"
    # constraints pass over full devices; too few left says how many are full
    group = {"id": "x", "devices": [{"constraints": {"type": "gpu", "product": "A100"}}], "sharing": ts}
    assert limited(group, 2) == ["G2"]
    with pytest.raises(InsufficientDevices) as e:
        limited(group, 1)
    assert e.value.details["at_share_limit"] == 2 and "allocations.max_per_device" in e.value.message


def test_checkpoint_entries_render_once():
    from hostagent.daemon.allocations import Allocation
    import json
    a = Allocation("a", ("G1",), normalize({"id": "a", "devices": [{"device": "1"}]}), 1.5)
    assert json.loads(a.checkpoint_json) == a.checkpoint()
    assert a.checkpoint_json is a.checkpoint_json
