"""From what is in force to what is wanted: steps in a safe order, nothing for what matches."""

import pytest

from hostagent.daemon.allocations import Allocation
from hostagent.errors import ConflictError
from hostagent.sharing.plan import Live, daemon_settings, plan
from hostagent.sharing.resolve import resolve
from hostagent.sharing.service import refuse_allocated
from hostagent.sharing.state import DaemonRecord, SharingState

from .test_sharing_resolve import config, node, uuid

MPS01 = dict(mps=[{"name": "gpu", "replicas": 4, "devices": [0, 1]}],
             ts=[{"name": "gpu", "replicas": 2, "devices": [2], "interval": "Short"}])


def applied(desired, modes_before="DEFAULT"):
    """The state and live view right after ``desired`` was applied."""
    state = SharingState(devices=dict(desired.devices),
                         saved_modes={u: modes_before for u, g in desired.gpus.items() if g.compute_mode != modes_before},
                         intervals={u: g.interval for u, g in desired.gpus.items() if g.interval},
                         daemons={u: DaemonRecord(u, 100 + i, 0.0, daemon_settings(d))
                                  for i, (u, d) in enumerate(desired.daemons.items())})
    live = Live({u: g.compute_mode for u, g in desired.gpus.items()}, frozenset(desired.daemons))
    return state, live


def actions(p):
    return [(s.action, s.label) for s in p.steps]


def test_from_nothing_modes_come_before_daemons():
    desired = resolve(node(), config(**MPS01))
    p = plan(desired, SharingState(), Live({uuid(i): "DEFAULT" for i in range(3)}))
    assert actions(p) == [("set_compute_mode", "GPU 0"), ("set_compute_mode", "GPU 1"), ("set_interval", "GPU 2"),
                          ("start_daemon", "GPU 0"), ("start_daemon", "GPU 1"),
                          ("share", "GPU 0"), ("share", "GPU 1"), ("share", "GPU 2")]
    assert p.steps[0].describe() == "GPU 0: compute mode DEFAULT -> EXCLUSIVE_PROCESS"
    assert p.steps[3].detail["restart"] is False and p.changes_node


def test_what_is_in_force_plans_nothing():
    desired = resolve(node(), config(**MPS01))
    state, live = applied(desired)
    p = plan(desired, state, live)
    assert p.steps == () and not p.changes_node and p.describe() == ["nothing to change"]


def test_a_daemon_that_stopped_answering_is_started_again():
    desired = resolve(node(), config(**MPS01))
    state, live = applied(desired)
    p = plan(desired, state, Live(live.compute_modes, frozenset({uuid(1)})))
    assert actions(p) == [("start_daemon", "GPU 0")] and p.steps[0].detail["restart"] is True
    # Someone set the mode back behind our back: set again, before the daemon.
    p = plan(desired, state, Live({**live.compute_modes, uuid(0): "DEFAULT"}, frozenset({uuid(1)})))
    assert actions(p) == [("set_compute_mode", "GPU 0"), ("start_daemon", "GPU 0")]


def test_off_stops_daemons_before_restoring_what_was_there():
    desired = resolve(node(), config(**MPS01))
    state, live = applied(desired)
    p = plan(resolve(node(), config()), state, live)
    assert actions(p) == [("stop_daemon", "GPU 0"), ("stop_daemon", "GPU 1"), ("restore_interval", "GPU 2"),
                          ("restore_compute_mode", "GPU 0"), ("restore_compute_mode", "GPU 1"),
                          ("unshare", "GPU 0"), ("unshare", "GPU 1"), ("unshare", "GPU 2")]
    assert p.steps[3].detail == {"from": "EXCLUSIVE_PROCESS", "to": "DEFAULT"}
    # A mode someone already put back needs no restore; a daemon found running unrecorded is stopped.
    p = plan(resolve(node(), config()), state, Live({**live.compute_modes, uuid(0): "DEFAULT"},
                                                    live.answering | {uuid(2)}))
    assert ("restore_compute_mode", "GPU 0") not in actions(p) and ("stop_daemon", "GPU 2") in actions(p)


def test_changed_limits_reconfigure_a_running_daemon_and_replicas_only_advertise():
    desired = resolve(node(), config(**MPS01))
    state, live = applied(desired)
    more = resolve(node(), config(mps=[{"name": "gpu", "replicas": 8, "devices": [0, 1], "activeThreadPercentage": 50}],
                                  ts=MPS01["ts"]))
    p = plan(more, state, live)
    assert actions(p) == [("configure_daemon", "GPU 0"), ("configure_daemon", "GPU 1"), ("share", "GPU 0"),
                          ("share", "GPU 1")]
    assert p.steps[0].detail["active_thread_percentage"] == 50 and len(p.steps[2].detail["replicas"]) == 8


def test_devices_in_allocations_keep_their_sharing():
    desired = resolve(node(), config(**MPS01))
    state, _ = applied(desired)
    a = Allocation(id="pod-a", devices=(uuid(0),), request={"sharing": {"strategy": "MPS"}}, created=0.0)
    refuse_allocated(state, desired, [a])                               # unchanged: fine
    refuse_allocated(state, resolve(node(), config(mps=[{"name": "gpu", "replicas": 6, "devices": [0, 1]}])), [a])
    for other in (config(), config(ts=[{"name": "gpu", "replicas": 4, "devices": [0]}]),
                  config(mps=[{"name": "gpu", "replicas": 2, "devices": [0]}])):
        with pytest.raises(ConflictError) as e:
            refuse_allocated(state, resolve(node(), other), [a])
        assert e.value.code == "device_busy" and e.value.details["allocations"] == ["pod-a"]
    b = Allocation(id="pod-b", devices=(uuid(2),), request={"sharing": {"strategy": "Exclusive"}}, created=0.0)
    with pytest.raises(ConflictError):          # an unshared device in use is not shared under it
        refuse_allocated(SharingState(), desired, [b])
