"""The publisher against the test API server through the real client: a pool written whole
with one generation, nothing written when nothing changed (a restarted plugin), slices no
longer wanted deleted after the new ones, fields an API server drops reported once and not
fought over."""

import pytest

pytest.importorskip("lightkube", reason="lightkube is a dependency of the DRA plugin")

from hostagent.plugins.dra.errors import KubeError  # noqa: E402
from hostagent.plugins.dra.kube import KubeApi, load_config  # noqa: E402
from hostagent.plugins.dra.publisher import Publisher  # noqa: E402
from tests.integration.kubeapi import TestApiServer  # noqa: E402

DRIVER, NODE = "gpu.nvidia.com", "node-1"


@pytest.fixture
def server(tmp_path):
    s = TestApiServer((1, 35)).start()
    s.add_node(NODE)
    s.kubeconfig_path = s.kubeconfig(tmp_path / "kubeconfig")
    yield s
    s.stop()


@pytest.fixture
def api(server):
    a = KubeApi(load_config(str(server.kubeconfig_path)), timeout=5)
    yield a
    a.close()


def spec(*names, counters=None):
    out = {"driver": DRIVER, "pool": {"name": NODE}, "nodeName": NODE}
    if counters is not None:
        out["sharedCounters"] = [{"name": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}}]
        return out
    out["devices"] = [{"name": n, "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "40Gi"}}}
                      for n in names]
    return out


def pool(server):
    return [(s["metadata"]["name"], [d["name"] for d in s["spec"].get("devices") or []],
             s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
            for s in server.pool(DRIVER, NODE)]


def test_a_pool_is_written_whole_once_and_not_again_while_it_is_the_same(server, api):
    p = Publisher(api, DRIVER, NODE, owner_uid=server.nodes[NODE]["metadata"]["uid"])
    out = p.sync([spec("gpu-0", "gpu-1"), spec("gpu-2")])
    assert (out.generation, out.written, out.deleted) == (1, 2, 0)
    assert pool(server) == [("node-1-gpu.nvidia.com-000", ["gpu-0", "gpu-1"], 1, 2),
                            ("node-1-gpu.nvidia.com-001", ["gpu-2"], 1, 2)]
    owner = server.slices["node-1-gpu.nvidia.com-000"]["metadata"]["ownerReferences"]
    assert owner == [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": server.nodes[NODE]["metadata"]["uid"],
                      "controller": True}]
    writes = server.writes
    assert not p.sync([spec("gpu-0", "gpu-1"), spec("gpu-2")]).changed
    # A new publisher (the plugin restarted) finds the same pool: no churn either.
    again = Publisher(api, DRIVER, NODE)
    assert not again.sync([spec("gpu-0", "gpu-1"), spec("gpu-2")]).changed and again.generation == 1
    assert server.writes == writes


def test_a_change_raises_the_generation_of_every_slice_and_drops_the_rest(server, api):
    p = Publisher(api, DRIVER, NODE)
    p.sync([spec("gpu-0"), spec("gpu-1"), spec("gpu-2")])
    out = p.sync([spec("gpu-0", "gpu-1")])
    assert (out.generation, out.written, out.deleted) == (2, 1, 2)
    assert pool(server) == [("node-1-gpu.nvidia.com-000", ["gpu-0", "gpu-1"], 2, 1)]
    assert len(server.slices) == 1
    # The node's slices deleted (a kubelet starting): written again, at a new generation.
    server.delete_slices(NODE)
    assert p.sync([spec("gpu-0", "gpu-1")]).generation == 3 and len(server.slices) == 1
    # An empty pool still has its one slice: the driver is there, with no devices.
    assert p.sync([spec()]).written == 1 and pool(server) == [("node-1-gpu.nvidia.com-000", [], 4, 1)]


def test_a_slice_the_server_refuses_is_an_error_and_nothing_half_counts(server, api):
    p = Publisher(api, DRIVER, NODE)
    p.sync([spec("gpu-0")])
    with pytest.raises(KubeError) as e:
        p.sync([spec("gpu-0"), spec("GPU_1")])
    assert e.value.status == 422 and "is not a DNS label" in e.value.message
    assert not server.complete(DRIVER, NODE)           # generation 2 has one slice of two: incomplete
    assert p.sync([spec("gpu-0"), spec("gpu-1")]).written == 2 and server.complete(DRIVER, NODE)


def test_fields_the_server_drops_are_reported_and_not_written_again(server, api, caplog):
    server.partitionable = False                       # DRAPartitionableDevices off
    p = Publisher(api, DRIVER, NODE)
    wanted = [spec(counters=True), spec("gpu-0")]
    assert p.sync(wanted).written == 2
    assert p.dropped == ["spec.sharedCounters"]
    assert "enable the DRAPartitionableDevices feature gate" in caplog.text
    writes = server.writes
    assert not p.sync(wanted).changed and server.writes == writes


def test_fields_the_server_adds_are_no_change(server, api):
    server.defaulting = True
    wanted = [spec("gpu-0", "gpu-1")]
    Publisher(api, DRIVER, NODE).sync(wanted)
    writes = server.writes
    assert all(d["allowMultipleAllocations"] is False for d in server.pool(DRIVER, NODE)[0]["spec"]["devices"])
    assert not Publisher(api, DRIVER, NODE).sync(wanted).changed and server.writes == writes
    # A device of the server's slice that differs in what the plugin sets is a change.
    assert Publisher(api, DRIVER, NODE).sync([spec("gpu-0", "gpu-2")]).changed


def tainted(name: str, *taints) -> dict:
    device = spec(name)["devices"][0]
    if not taints:
        return device
    return {**device, "taints": [{"key": k, **({"value": v} if v else {}), "effect": e} for k, v, e in taints]}


def devices_spec(*devices) -> dict:
    return {**spec(), "devices": list(devices)}


def stored_taints(server) -> dict:
    return {d["name"]: d.get("taints") for s in server.pool(DRIVER, NODE) for d in s["spec"]["devices"]}


def test_a_taint_that_stays_keeps_its_time_added_across_rewrites(server, api):
    server.device_taints = True
    p = Publisher(api, DRIVER, NODE)
    xid = ("gpu.nvidia.com/xid", "48", "NoSchedule")
    p.sync([devices_spec(tainted("gpu-0", xid), tainted("gpu-1"))])
    [(name, slice_)] = server.slices.items()
    slice_["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2020-01-01T00:00:00Z"   # added long ago
    # Nothing changed: nothing written, the server's time stands.
    assert not p.sync([devices_spec(tainted("gpu-0", xid), tainted("gpu-1"))]).changed
    # Another device tainted: the slice is written again, the first taint keeps its time, the new one gets one.
    lost = ("gpu.nvidia.com/gpu-lost", None, "NoSchedule")
    assert p.sync([devices_spec(tainted("gpu-0", xid), tainted("gpu-1", lost))]).written == 1
    taints = stored_taints(server)
    assert taints["gpu-0"][0]["timeAdded"] == "2020-01-01T00:00:00Z"
    assert taints["gpu-1"][0]["timeAdded"] not in (None, "2020-01-01T00:00:00Z")
    # A new value is a new taint (a new time); a taint gone is gone.
    p.sync([devices_spec(tainted("gpu-0", ("gpu.nvidia.com/xid", "63", "NoSchedule")), tainted("gpu-1"))])
    taints = stored_taints(server)
    assert taints["gpu-0"][0]["timeAdded"] != "2020-01-01T00:00:00Z" and not taints["gpu-1"]
    assert not server.rejected


def test_taints_a_server_drops_are_said_once_and_reported(server, api, caplog):
    server.device_taints = False                   # DRADeviceTaints off (1.35's default)
    p = Publisher(api, DRIVER, NODE)
    wanted = [devices_spec(tainted("gpu-0", ("gpu.nvidia.com/xid", "48", "NoSchedule")))]
    assert p.sync(wanted).written == 1
    assert p.taints_dropped and p.dropped == ["spec.devices.taints"]
    assert caplog.text.count("its DRADeviceTaints feature gate is off") == 1
    assert "DRAPartitionableDevices" not in caplog.text
    writes = server.writes
    assert not p.sync(wanted).changed and server.writes == writes
    p.sync([devices_spec(tainted("gpu-1", ("gpu.nvidia.com/xid", "79", "NoSchedule")))])
    assert caplog.text.count("its DRADeviceTaints feature gate is off") == 1


def test_a_taint_gone_is_a_change(server, api):
    server.device_taints = True
    p = Publisher(api, DRIVER, NODE)
    p.sync([devices_spec(tainted("gpu-0", ("gpu.nvidia.com/xid", "48", "NoSchedule")))])
    assert p.sync([devices_spec(tainted("gpu-0"))]).written == 1
    assert stored_taints(server) == {"gpu-0": None}
