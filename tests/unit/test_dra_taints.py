"""Device taints from the agent's health: NVIDIA's keys, values and effects
(device_health.go's healthEventToTaint), as long as the health says so, NoExecute only when
asked, and what each API server version takes."""

import pytest

from hostagent.plugins.dra.devices import Pool, Published
from hostagent.plugins.dra.slices import layout
from hostagent.plugins.dra.taints import device_taints, for_server, tainted

XID, LOST, UNMONITORED = "gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/unmonitored"


def health(state="unhealthy", *problems, monitored=True) -> dict:
    return {"state": state, "reason": "x", "message": "x", "since": 1.0, "monitored": monitored,
            "problems": [{"kind": k, "xid": x, **({"ignored": True} if ignored else {}), "at": 1.0}
                         for k, x, ignored in problems]}


def plain(taints) -> list[tuple]:
    return [(t["key"], t.get("value"), t["effect"]) for t in taints]


@pytest.mark.parametrize("h, want", [
    (health("healthy"), []),
    (None, []),                                                      # not in the agent's view: nothing known
    ({"state": "unknown"}, []),
    (health("unhealthy", ("xid", 48, False)), [(XID, "48", "NoSchedule")]),
    # the latest counted XID is the value; an ignored one after it does not downgrade it
    (health("unhealthy", ("xid", 48, False), ("xid", 63, False), ("xid", 13, True)), [(XID, "63", "NoSchedule")]),
    (health("healthy", ("xid", 13, True)), [(XID, "13", "None")]),   # NVIDIA's skipped XIDs: None
    (health("unhealthy", ("ecc_dbe", None, False)), [(XID, "48", "NoSchedule")]),
    (health("unhealthy", ("gpu_lost", None, False), monitored=False), [(LOST, None, "NoSchedule")]),
    (health("unhealthy", ("xid", 79, False), ("gpu_lost", None, False), monitored=False),
     [(XID, "79", "NoSchedule"), (LOST, None, "NoSchedule")]),
    (health("unmonitored", monitored=False), [(UNMONITORED, None, "None")]),
    (health("unhealthy", ("xid", 48, False), monitored=False),
     [(XID, "48", "NoSchedule"), (UNMONITORED, None, "None")]),
])
def test_nvidias_keys_values_and_effects(h, want):
    assert plain(device_taints(h)) == want


def test_no_execute_only_for_what_cannot_recover_and_only_when_asked():
    h = health("unhealthy", ("xid", 79, False), ("gpu_lost", None, False), monitored=False)
    assert plain(device_taints(h, no_execute=True)) == [(XID, "79", "NoExecute"), (LOST, None, "NoExecute")]
    assert plain(device_taints(health("unhealthy", ("xid", 48, False)), no_execute=True)) == [
        (XID, "48", "NoSchedule")]


def device(name, health_of="GPU-0", consumes=None) -> Published:
    return Published(name, "gpu", "GPU-0", health_of, {"type": {"string": "gpu"}}, {}, {"device": health_of},
                     consumes=consumes)


def test_each_device_takes_the_taints_of_the_health_it_stands_for_and_each_server_what_it_knows():
    pool = Pool((device("gpu-0", "GPU-0"), device("gpu-1", "GPU-1"), device("gpu-2", "GPU-2")))
    views = {"GPU-0": {"health": health("unhealthy", ("xid", 48, False))},
             "GPU-1": {"health": health("healthy", ("xid", 13, True))}}
    marked = tainted(pool, views)
    assert [plain(d.taints) for d in marked.devices] == [[(XID, "48", "NoSchedule")], [(XID, "13", "None")], []]
    assert marked != pool                                            # a health change is a pool change
    # 1.34 knows no None effect; a server with the gate off keeps no taints; 1.35 keeps all.
    assert [plain(d.taints) for d in for_server(marked, (1, 34)).devices] == [[(XID, "48", "NoSchedule")], [], []]
    assert all(not d.taints for d in for_server(marked, (1, 36), taken=False).devices)
    assert for_server(marked, (1, 35)) == marked
    [spec] = layout(marked, "gpu.nvidia.com", "node-1", "node-1", (1, 35))
    assert spec["devices"][0]["taints"] == [{"key": XID, "value": "48", "effect": "NoSchedule"}]
    assert "taints" not in spec["devices"][2]


def test_from_1_35_a_slice_with_a_tainted_device_holds_at_most_64():
    devices = tuple(device(f"gpu-{i}", f"GPU-{i}") for i in range(100))
    views = {"GPU-7": {"health": health("unhealthy", ("xid", 48, False))}}
    assert [len(s["devices"]) for s in layout(Pool(devices), "d", "p", "n", (1, 35))] == [100]
    assert [len(s["devices"]) for s in layout(tainted(Pool(devices), views), "d", "p", "n", (1, 35))] == [64, 36]
    assert [len(s["devices"]) for s in layout(tainted(Pool(devices), views), "d", "p", "n", (1, 34))] == [100]
