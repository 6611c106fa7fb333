"""Device diffs and the name lookup, pure."""

from hostagent.daemon.state import Snapshot, diff_devices, lookup_table


def view(uuid, name, **kw):
    return {"kind": "gpu", "name": name, "uuid": uuid, "cdi_devices": [f"nvidia.com/gpu={name}"], **kw}


def test_diff_orders_removals_first_and_names_changed_fields():
    old = {"A": {**view("A", "0", health=1), "revision": 3}, "B": {**view("B", "1"), "revision": 4}}
    new = {"C": view("C", "1"), "A": view("A", "0", health=2)}
    assert diff_devices(old, new) == [("device_removed", "B", []), ("device_added", "C", []),
                                      ("device_changed", "A", ["health"])]
    assert diff_devices(old, {k: {kk: vv for kk, vv in v.items() if kk != "revision"}
                              for k, v in old.items()}) == []


def test_lookup_by_every_name():
    devices = {"GPU-1": view("GPU-1", "0")}
    devices["GPU-1"]["cdi_devices"].append("nvidia.com/gpu=GPU-1")
    table = lookup_table(devices)
    snap = Snapshot(1, {}, devices, [], {}, table)
    for name in ("0", "GPU-1", "nvidia.com/gpu=0", "gpu=0", "nvidia.com/gpu=GPU-1", " 0 "):
        assert snap.find(name)["uuid"] == "GPU-1", name
    assert snap.find("1") is None
    calls = []
    assert snap.cached("k", lambda: calls.append(1) or "v") == "v" == snap.cached("k", lambda: "other")
    assert calls == [1]
