"""Allocation rules, pure: normalisation, named and constrained selection, best fit,
sharing and conflicts."""

import pytest

from hostagent.daemon.allocations import (AllocationConflict, Candidate, DeviceBusy,
                                          DeviceNotAllocatable, InsufficientDevices,
                                          ShareLimitReached, UnknownDevice, normalize, select)
from hostagent.errors import ConflictError, UsageError


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
    return select(normalize(body), NODE, users or {}, NAMES.get, lambda u: u not in unhealthy).devices


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
    with pytest.raises(DeviceNotAllocatable) as e:      # MPS only where the configuration runs a daemon
        pick({"id": "a", "devices": [{"device": "2"}], "sharing": {"strategy": "MPS"}}, users)
    assert "not shared with MPS" in e.value.message
    # Shared constraint groups prefer the least shared device.
    got = pick({"id": "a", "devices": [{"constraints": {"type": "gpu", "product": "A100"}}],
                "sharing": {"strategy": "TimeSlicing"}}, {"G2": [("ts", "TimeSlicing")]})
    assert got == ["G1"]
    assert issubclass(AllocationConflict, Exception)


def test_shares_per_device_are_bounded():
    ts = {"strategy": "TimeSlicing"}
    users = {"G1": [("a", "TimeSlicing"), ("b", "TimeSlicing")], "G2": [("c", "TimeSlicing")]}

    def limited(body, limit):
        return select(normalize(body), NODE, users, NAMES.get, lambda u: True, max_per_device=limit).devices
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


def test_only_node_names_leave_the_transient_spec_out():
    from hostagent.daemon.allocations import Allocation
    body = {"id": "a", "devices": [{"device": "1"}]}
    # The default is left out of the request, so checkpoints made before the field compare equal.
    assert "cdi_names" not in normalize(body) and normalize({**body, "cdi_names": "allocation"}) == normalize(body)
    node = normalize({**body, "cdi_names": "node"})
    assert node["cdi_names"] == "node" and node != normalize(body)
    assert Allocation("a", ("G1",), normalize(body), 1.0).own_spec
    assert not Allocation("a", ("G1",), node, 1.0).own_spec
    # An MPS client's pipe, shared memory and limits are in no node spec: it gets its own.
    assert Allocation("a", ("G1",), node, 1.0, replicas=("G1",), shared_as="mps").own_spec
    assert not Allocation("a", ("G1",), node, 1.0, replicas=("G1::0",), shared_as="time-slicing").own_spec


# ---- devices the node's sharing configuration shares ---------------------------------------

def shared(c, strategy, replicas, fail=False):
    import dataclasses
    ids = [f"{c.uuid}::{i}" for i in range(replicas)] if replicas > 1 else [c.uuid]
    return dataclasses.replace(c, shared={"strategy": strategy, "replica_ids": ids,
                                          "fail_requests_greater_than_one": fail})


SHARED = [NODE[0], NODE[1], shared(NODE[2], "mps", 1), NODE[3], shared(NODE[4], "mps", 4, fail=True),
          shared(NODE[5], "time-slicing", 3), NODE[6]]


def take(body, taken=None, users=None):
    return select(normalize(body), SHARED, users or {}, NAMES.get, lambda u: True, taken=taken or {})


def test_replicas_are_named_or_picked_and_held_once():
    s = take({"id": "a", "devices": [{"device": "G1::2"}]})
    assert (s.devices, s.replicas, s.shared_as) == (["G1"], ["G1::2"], "mps")
    s = take({"id": "a", "devices": [{"device": "1"}]}, taken={"G1": {"G1::0"}}, users={"G1": [("x", "MPS")]})
    assert s.replicas == ["G1::1"]                      # a plain name takes the first free replica
    with pytest.raises(DeviceBusy) as e:
        take({"id": "a", "devices": [{"device": "G1::0"}]}, taken={"G1": {"G1::0"}}, users={"G1": [("x", "MPS")]})
    assert e.value.details["allocations"] == ["x"]
    with pytest.raises(UnknownDevice):
        take({"id": "a", "devices": [{"device": "G1::4"}]})          # 4 replicas: 0..3
    with pytest.raises(UnknownDevice):
        take({"id": "a", "devices": [{"device": "T0::0"}]})          # not shared: no replicas
    full = {"G1": {f"G1::{i}" for i in range(4)}}
    with pytest.raises(DeviceBusy) as e:
        take({"id": "a", "devices": [{"device": "1"}]}, taken=full)
    assert "every replica of device 1" in e.value.message
    one = take({"id": "a", "devices": [{"device": "0:2"}]})            # one replica: the device itself
    assert one.replicas == ["M1"] and one.shared_as == "mps"
    with pytest.raises(DeviceBusy):
        take({"id": "b", "devices": [{"device": "0:2"}]}, taken={"M1": {"M1"}})


def test_configured_sharing_wins_and_limits_requests():
    with pytest.raises(DeviceNotAllocatable) as e:
        take({"id": "a", "devices": [{"device": "G1::0"}], "sharing": {"strategy": "TimeSlicing"}})
    assert "shares it with mps, not TimeSlicing" in e.value.message
    assert take({"id": "a", "devices": [{"device": "2"}], "sharing": {"strategy": "TimeSlicing"}}).shared_as \
        == "time-slicing"
    # failRequestsGreaterThanOne (the device plugin's words), and an MPS allocation is one device.
    with pytest.raises(UsageError) as e:
        take({"id": "a", "devices": [{"device": "G1::0"}, {"device": "G1::1"}]})
    assert "maximum request size for shared resources is 1; found 2" in e.value.message
    two = take({"id": "a", "devices": [{"device": "G2::0"}, {"device": "G2::1"}]})
    assert two.devices == ["G2"] and two.replicas == ["G2::0", "G2::1"]
    with pytest.raises(UsageError) as e:
        take({"id": "a", "devices": [{"device": "G1::0"}, {"device": "0:2"}]})
    assert "an MPS allocation takes one device" in e.value.message
    with pytest.raises(ConflictError) as e:
        take({"id": "a", "devices": [{"device": "G2::0"}, {"device": "3"}]})
    assert e.value.code == "sharing_mismatch"
    # Constraint groups take free replicas of matching shared devices, one per device.
    group = {"id": "a", "devices": [{"constraints": {"type": "gpu", "product": "A100"}}],
             "sharing": {"strategy": "TimeSlicing"}}
    assert take(group, taken={"G2": {"G2::0"}}).replicas == ["G2::1"]
    with pytest.raises(InsufficientDevices) as e:       # G1 is MPS's, G2's replicas are taken
        take(group, taken={"G2": {"G2::0", "G2::1", "G2::2"}})
    assert e.value.details["at_share_limit"] == 1


def test_too_few_devices_says_why_the_matching_ones_are_not_available():
    """A node whose spec describes no device (a user's simulated node before its CDI spec
    could be written) says so, not only how many match."""
    node = [cand(f"G{i}", str(i), why="not in the CDI spec", order=i) for i in range(8)]
    with pytest.raises(InsufficientDevices) as e:
        select(normalize({"id": "x", "devices": [{"constraints": {"type": "gpu"}}]}), node, {},
               lambda n: n, lambda u: u != "G7")
    assert "0 available (8 match, 8 not in the CDI spec)" in e.value.message
    node[7] = cand("G7", "7", order=7)
    with pytest.raises(InsufficientDevices) as e:
        select(normalize({"id": "x", "devices": [{"constraints": {"type": "gpu"}}]}), node, {},
               lambda n: n, lambda u: u != "G7")
    assert "0 available (8 match, 7 not in the CDI spec, 1 unhealthy)" in e.value.message
