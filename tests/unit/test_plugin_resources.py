"""Resources from device views under the none, single and mixed MIG strategies, and the
health the kubelet is told."""

import pytest

from hostagent.plugins.resources import GPU_RESOURCE, mig_resource, node_resources, strategy_from_labels


def gpu(i, mig=None, numa=0, health="healthy", allocations=(), cdi=True):
    return {"kind": "gpu", "uuid": f"GPU-{i}", "index": i, "numa_node": numa,
            "mig": None if mig is None else {"mode": {"current": "enabled", "pending": "enabled"},
                                             "devices": [m["uuid"] for m in mig]},
            "health": {"state": health, "message": f"{health} because"},
            "cdi_devices": [f"nvidia.com/gpu=GPU-{i}"] if cdi else [], "allocations": list(allocations)}


def mig(parent, j, profile):
    return {"kind": "mig", "uuid": f"MIG-{parent}-{j}", "index": j, "parent_index": parent,
            "parent_uuid": f"GPU-{parent}", "profile": profile, "health": {"state": "healthy"},
            "cdi_devices": [f"nvidia.com/gpu={parent}:{j}"], "allocations": []}


def node(*gpus_and_migs):
    out = {}
    for item in gpus_and_migs:
        views = item if isinstance(item, list) else [item]
        for v in views:
            out[v["uuid"]] = v
    return out


def ids(resources):
    return {name: [d.id for d in devices] for name, devices in resources.items()}


def test_none_lists_whole_gpus_and_leaves_mig_enabled_ones_out():
    m = [mig(1, 0, "1g.5gb")]
    res, problems = node_resources(node(gpu(0), gpu(1, m), m, gpu(2, numa=1)), "none")
    assert ids(res) == {GPU_RESOURCE: ["GPU-0", "GPU-2"]}
    assert [d.numa for d in res[GPU_RESOURCE]] == [0, 1]
    assert "GPU(s) 1 have MIG enabled" in problems[0]


def test_mixed_names_mig_resources_as_the_device_plugin_does():
    m0 = [mig(0, 1, "3g.20gb"), mig(0, 0, "1g.5gb")]
    m1 = [mig(1, 0, "1g.10gb+me")]
    res, problems = node_resources(node(gpu(0, m0, numa=1), m0, gpu(1, m1), m1, gpu(2)), "mixed")
    assert ids(res) == {GPU_RESOURCE: ["GPU-2"], "nvidia.com/mig-1g.5gb": ["MIG-0-0"],
                        "nvidia.com/mig-3g.20gb": ["MIG-0-1"], "nvidia.com/mig-1g.10gb.me": ["MIG-1-0"]}
    assert res["nvidia.com/mig-3g.20gb"][0].numa == 1       # the parent GPU's NUMA node
    assert problems == [] and mig_resource("1g.10gb+me.all") == "nvidia.com/mig-1g.10gb.me.all"


def test_single_uses_mig_devices_as_gpus_only_when_uniform():
    m0, m1 = [mig(0, 0, "1g.5gb")], [mig(1, 0, "1g.5gb"), mig(1, 1, "1g.5gb")]
    res, problems = node_resources(node(gpu(0, m0), m0, gpu(1, m1), m1), "single")
    assert ids(res) == {GPU_RESOURCE: ["MIG-0-0", "MIG-1-0", "MIG-1-1"]} and problems == []
    res, problems = node_resources(node(gpu(0), gpu(1)), "single")
    assert ids(res) == {GPU_RESOURCE: ["GPU-0", "GPU-1"]}
    for bad, words in ((node(gpu(0), gpu(1, m1), m1), "MIG disabled"),
                       (node(gpu(0, m0), m0, gpu(1, [])), "have none"),
                       (node(gpu(0, m0), m0, gpu(1, [mig(1, 0, "2g.10gb")]), mig(1, 0, "2g.10gb")), "one MIG profile")):
        res, problems = node_resources(bad, "single")
        assert res == {} and any(words in p for p in problems), problems


def test_health_follows_the_agent_the_spec_and_foreign_allocations():
    views = node(gpu(0), gpu(1, health="unhealthy"), gpu(2, cdi=False), gpu(3, allocations=["batch"]),
                 gpu(4, allocations=["k8s-device-plugin/nvidia.com/gpu/1"]), gpu(5, health="unmonitored"))
    res, _ = node_resources(views, "none", owned=lambda a: a.startswith("k8s-device-plugin/"))
    health = {d.id: (d.health, d.why) for d in res[GPU_RESOURCE]}
    assert [h for h, _ in health.values()] == ["Healthy", "Unhealthy", "Unhealthy", "Unhealthy", "Healthy", "Healthy"]
    assert health["GPU-1"][1] == "unhealthy because" and "CDI spec" in health["GPU-2"][1]
    assert "outside Kubernetes: batch" in health["GPU-3"][1]
    res, _ = node_resources(views, "none", connected=False)
    assert {d.health for d in res[GPU_RESOURCE]} == {"Unhealthy"}


def test_strategy_comes_from_the_agents_labels():
    assert strategy_from_labels({}) == "none"
    assert strategy_from_labels({"nvidia.com/mig.strategy": "mixed"}) == "mixed"
    assert strategy_from_labels({"nvidia.com/mig.strategy": "bogus"}) == "none"
    with pytest.raises(ValueError):
        node_resources({}, "bogus")


def test_shared_devices_are_advertised_as_their_replicas_under_the_rename():
    shared = gpu(1, numa=1)
    shared.update(replicas=["GPU-1::0", "GPU-1::1"], sharing={"strategy": "time-slicing", "rename": "nvidia.com/gpu.shared"})
    mps = gpu(2)
    mps.update(replicas=["GPU-2::0", "GPU-2::1"], sharing={"strategy": "mps", "rename": None, "mps": {"state": "starting"}})
    res, _ = node_resources(node(gpu(0), shared, mps), "none")
    assert ids(res) == {GPU_RESOURCE: ["GPU-0", "GPU-2::0", "GPU-2::1"], "nvidia.com/gpu.shared": ["GPU-1::0", "GPU-1::1"]}
    assert {(d.uuid, d.numa, d.health) for d in res["nvidia.com/gpu.shared"]} == {("GPU-1", 1, "Healthy")}
    assert {(d.health, d.why) for d in res[GPU_RESOURCE][1:]} == {("Unhealthy", "its MPS control daemon is starting")}
