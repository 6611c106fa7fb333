"""The node controller's parts on their own: the pure planners (MIG by label, sharing's
choice, health), and the executors against the test API server (patches retried on 409,
Events counted, cordon that lifts only its own, evictions retried on 429)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("lightkube", reason="lightkube is a dependency")

from hostagent.plugins.nodecontroller import healthplan, migplan, sharingplan  # noqa: E402
from hostagent.plugins.nodecontroller.configs import MigFile, config_names  # noqa: E402
from hostagent.plugins.nodecontroller.cordon import Cordon, cordon_patch, lifted_patch, uncordon_patch  # noqa: E402
from hostagent.plugins.nodecontroller.events import EventRecorder  # noqa: E402
from hostagent.plugins.nodecontroller.evict import Evictor, Refused  # noqa: E402
from hostagent.plugins.nodecontroller.holders import holders  # noqa: E402
from hostagent.plugins.nodecontroller.kube import NodeApi, load_config  # noqa: E402
from hostagent.plugins.nodecontroller.writer import NodeWriter  # noqa: E402
from hostagent.mig.spec import parse_spec  # noqa: E402
from tests.integration.kubeapi import TestApiServer  # noqa: E402

SPEC = parse_spec({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}}, "f.yaml")


@pytest.fixture
def api(tmp_path):
    server = TestApiServer((1, 35)).start()
    server.add_node("n")
    client = NodeApi(load_config(str(server.kubeconfig(tmp_path / "kc"))))
    yield server, client
    client.close()
    server.stop()
    assert not server.rejected, server.rejected


# ---- planners -------------------------------------------------------------------------------

def test_mig_steps():
    assert migplan.wanted({}) is None and migplan.wanted({"nvidia.com/mig.config": ""}) is None
    failed = migplan.check_name("b", MigFile(Path("f.yaml"), SPEC))
    assert failed.state == "failed" and "f.yaml has no config 'b' (configs: a)" in failed.event[2]
    assert migplan.check_name("a", MigFile(Path("f.yaml"), SPEC)) is None
    assert migplan.check_name("x", MigFile(None)) is None                   # the agent's configs decide
    assert migplan.after_plan("a", {"plan": {"changed": []}, "busy": []}, "wait").state == "success"
    go = migplan.after_plan("a", {"plan": {"changed": [0]}, "busy": []}, "wait")
    assert (go.state, go.apply) == ("pending", True)
    busy = [{"id": "k8s-dra/u", "labels": {"claim": "ns/c"}, "devices": ["MIG-1"]}]
    wait = migplan.after_plan("a", {"plan": {"changed": [0]}, "busy": busy}, "wait")
    assert (wait.state, wait.apply, wait.evict) == ("pending", False, False)
    assert "allocation k8s-dra/u (claim ns/c) holds MIG-1" in wait.event[2]
    assert migplan.after_plan("a", {"plan": {"changed": [0]}, "busy": busy}, "fail").state == "failed"
    assert migplan.after_plan("a", {"plan": {"changed": [0]}, "busy": busy}, "evict").evict


def test_devices_an_unreadable_checkpoint_record_holds_are_waited_for_never_evicted_for():
    """No pod holds them: only the agent's admin, dismissing the record, frees them."""
    record = {"id": "unreadable checkpoint record 1", "labels": {}, "devices": ["MIG-1"],
              "unreadable": {"kept_as": "/var/lib/hostagent/allocations.journal.unreadable-1", "reason": "r"}}
    busy = [{"id": "k8s-dra/u", "labels": {"claim": "ns/c"}, "devices": ["MIG-2"]}, record]
    for on_busy in ("wait", "evict"):
        step = migplan.after_plan("a", {"plan": {"changed": [0]}, "busy": busy}, on_busy)
        assert (step.state, step.apply, step.evict) == ("pending", False, False), on_busy
        assert ("unreadable checkpoint record 1 of the agent's allocations checkpoint (kept in "
                "/var/lib/hostagent/allocations.journal.unreadable-1) may hold MIG-1 until an admin dismisses it"
                in step.event[2])
    assert migplan.after_plan("a", {"plan": {"changed": [0]}, "busy": [record]}, "fail").state == "failed"


def test_sharing_choice_follows_the_config_managers_fallbacks():
    choose = sharingplan.choose
    assert choose({"nvidia.com/device-plugin.config": "x"}, None, ["x", "default"], "d").name == "x"
    assert "no sharing config 'y'" in choose({"nvidia.com/device-plugin.config": "y"}, None, ["x"], "d").problem
    assert choose({}, "x", ["x", "default"], "d").name == "x"
    assert choose({}, "z", ["x"], "d").problem
    assert choose({}, None, ["x", "default"], "d").name == "default"
    assert choose({}, None, ["only"], "d").name == "only"
    none = choose({}, None, ["x", "y"], "d")
    assert none.name is None and none.problem is None
    assert sharingplan.in_place(None, None) and sharingplan.in_place({}, None)


def gpu(i, state="healthy", message=None):
    return {"kind": "gpu", "name": str(i), "index": i, "uuid": f"GPU-{i}",
            "health": {"state": state, **({"reason": "xid", "message": message} if message else {})}}


def test_health_events_condition_and_taint():
    event = healthplan.fault_event({"kind": "xid", "xid": 79, "gpu": 1, "gpu_uuid": "GPU-1", "ignored": False})
    assert event == ("Warning", "GPUUnhealthy", "GPU 1 (GPU-1): XID 79, GPU has fallen off the bus")
    assert healthplan.fault_event({"kind": "xid", "xid": 13, "gpu": 1, "ignored": True}) is None
    devices = {"GPU-0": gpu(0), "GPU-1": gpu(1, "unhealthy", "XID 79")}
    found = healthplan.problems(devices, {})
    assert [str(p) for p in found] == ["GPU 1 (GPU-1): XID 79, GPU has fallen off the bus"]
    cond = healthplan.condition(found, None, "T1")
    assert cond["status"] == "True" and "GPU-1" in cond["message"]
    assert healthplan.condition(found, cond, "T2") is None                 # nothing new: no write
    ok = healthplan.condition([], cond, "T3")
    assert ok["status"] == "False" and ok["lastTransitionTime"] == "T3"
    assert not healthplan.taint_wanted(devices, {})
    assert healthplan.taint_wanted({"GPU-1": devices["GPU-1"]}, {})
    assert healthplan.taint_wanted(devices, {"driver": {"state": "degraded", "ready": False, "reason": "r"}})
    degraded = {"driver": {"state": "degraded", "ready": False, "reason": "r"}}
    assert [p.name for p in healthplan.problems(devices, degraded)] == ["GPU 0", "GPU 1"]
    # A driver changed on purpose (an install holds the agent in maintenance) is no fault.
    maintenance = {"driver": {"state": "maintenance", "ready": False, "reason": "driver install"}}
    assert healthplan.driver_down(maintenance) is None
    assert [p.name for p in healthplan.problems(devices, maintenance)] == ["GPU 1"]
    assert not healthplan.taint_wanted(devices, maintenance)
    back = healthplan.transitions({"GPU-1": "unhealthy"}, {"GPU-1": gpu(1)}, set())
    assert back == [("Normal", "GPUHealthy", "GPU 1 (GPU-1) is healthy again")]
    assert healthplan.transitions({}, devices, {"GPU-1"}) == []             # the fault Event said it
    assert healthplan.transitions({}, devices, set())[0][0] == "Warning"


def test_holders_of_claims_and_of_device_plugin_devices():
    pods = [{"metadata": {"namespace": "ns", "name": "p1"}, "spec": {"resourceClaims": [{"resourceClaimName": "c"}]}},
            {"metadata": {"namespace": "ns", "name": "p2"},
             "status": {"resourceClaimStatuses": [{"name": "g", "resourceClaimName": "p2-g-x"}]}},
            {"metadata": {"namespace": "other", "name": "p3"}, "spec": {"resourceClaims": [{"resourceClaimName": "c"}]}}]

    class Holding:
        namespace, pod, device_ids = "ns", "dp", ("MIG-9::1",)
    busy = [{"id": "a", "labels": {"claim": "ns/c"}, "devices": []},
            {"id": "b", "labels": {"claim": "ns/p2-g-x"}, "devices": []},
            {"id": "c", "labels": {"owner": "hostagent-device-plugin"}, "devices": ["MIG-9"]},
            {"id": "d", "labels": {}, "devices": ["MIG-8"]}]
    found = holders(busy, pods, [Holding()])
    assert found.pods == (("ns", "dp"), ("ns", "p1"), ("ns", "p2")) and found.unheld == ("d",)


def test_config_names_leave_out_a_configmap_volumes_own_entries(tmp_path):
    (tmp_path / "..2024_01").mkdir()
    (tmp_path / "..2024_01" / "a").write_text("x")
    (tmp_path / "..data").symlink_to("..2024_01")
    (tmp_path / "a").symlink_to("..data/a")
    (tmp_path / ".hidden").write_text("x")
    assert list(config_names(tmp_path)) == ["a"]


def test_cordon_lifts_only_its_own():
    node = {"metadata": {}, "spec": {}}
    assert cordon_patch(node, "mig") == {"spec": {"unschedulable": True},
                                         "metadata": {"annotations": {"hostagent.io/cordoned-by": "mig"}}}
    admins = {"metadata": {}, "spec": {"unschedulable": True}}
    assert cordon_patch(admins, "mig") is None and uncordon_patch(admins, "mig") is None
    both = {"metadata": {"annotations": {"hostagent.io/cordoned-by": "mig,upgrade"}}, "spec": {"unschedulable": True}}
    assert uncordon_patch(both, "mig") == {"metadata": {"annotations": {"hostagent.io/cordoned-by": "upgrade"}}}
    assert lifted_patch(both) is None
    # Someone else uncordoned it: the record of our cordon goes, and a cordon made after is theirs.
    lifted = {"metadata": {"annotations": {"hostagent.io/cordoned-by": "upgrade"}}, "spec": {}}
    assert lifted_patch(lifted) == uncordon_patch(lifted, "upgrade") == {
        "metadata": {"annotations": {"hostagent.io/cordoned-by": None}}}
    assert cordon_patch(lifted, "mig") == {"spec": {"unschedulable": True},
                                           "metadata": {"annotations": {"hostagent.io/cordoned-by": "mig"}}}


# ---- executors against the test API server --------------------------------------------------

def test_a_stale_node_is_read_again_on_409_and_the_others_change_kept(api):
    server, client = api
    writer = NodeWriter(client, "n")
    writer.seen(client.get_node("n"))
    server.label_node("n", {"admin": "x"})                  # someone else's change meanwhile
    writer.set_labels({"nvidia.com/mig.config.state": "pending"})
    labels = server.get("nodes", "n")["metadata"]["labels"]
    assert labels == {"admin": "x", "nvidia.com/mig.config.state": "pending"}
    assert [r[0] for r in server.requests].count("PATCH") == 2 and writer.writes == 1
    before = len(server.requests)
    assert writer.set_labels({"nvidia.com/mig.config.state": "pending"}) is None    # nothing to change
    assert len(server.requests) == before


def test_an_answer_that_comes_back_after_a_newer_one_does_not_replace_it(api):
    """Two threads write through one writer: the second's patch is made and answered while
    the first's answer is on its way. The Node kept is the newer, with both changes."""
    server, client = api
    writer = NodeWriter(client, "n")
    writer.seen(client.get_node("n"))

    class Overtaken:
        def __getattr__(self, name):
            return getattr(client, name)

        def patch_node(self, name, patch):
            answer = client.patch_node(name, patch)
            if "first" in patch["metadata"].get("labels", {}):      # another thread's write lands first
                writer.api = client
                writer.set_labels({"second": "b"})
            return answer
    writer.api = Overtaken()
    writer.set_labels({"first": "a"})
    assert writer.node["metadata"]["labels"] == {"first": "a", "second": "b"}
    assert writer.node["metadata"]["resourceVersion"] == server.get("nodes", "n")["metadata"]["resourceVersion"]


def test_cordon_through_the_api(api):
    server, client = api
    writer = NodeWriter(client, "n")
    cordon = Cordon(writer)
    assert cordon.cordon("mig") and server.get("nodes", "n")["spec"]["unschedulable"] is True
    assert cordon.uncordon("mig") and not server.get("nodes", "n")["spec"].get("unschedulable")
    assert "annotations" not in server.get("nodes", "n")["metadata"] or \
        "hostagent.io/cordoned-by" not in server.get("nodes", "n")["metadata"]["annotations"]


def test_repeats_are_counted_in_one_event_and_a_flood_is_written_once_a_second(api):
    server, client = api
    recorder = EventRecorder(client, "n", "hostagent", "hostagent-node-controller", min_interval=0.3)
    for _ in range(50):
        recorder.record("Warning", "GPUUnhealthy", "GPU 1 (GPU-1): XID 79")
    recorder.record("Normal", "GPUHealthy", "GPU 1 (GPU-1) is healthy again")
    from tests.waiting import until
    until(lambda: any(e.get("count") == 50 for e in server.events("n")), timeout=5, what="the count of 50")
    found = server.events("n")
    assert sorted((e["reason"], e["count"]) for e in found) == [("GPUHealthy", 1), ("GPUUnhealthy", 50)]
    assert recorder.writes <= 3                  # create, one patch with the repeats, the other Event
    recorder.close()


def test_evictions_retry_a_budgets_429_and_give_up_at_the_timeout(api):
    server, client = api
    for name in ("a", "b", "c"):
        server.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                       "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}]}})
    server.objects.blocked[("ns", "a")] = 2
    Evictor(client, timeout=5, retry=0.05).evict([("ns", "a"), ("ns", "gone")])
    assert server.objects.evicted == [("ns", "a")]
    server.objects.blocked[("ns", "b")] = None                   # never allowed
    with pytest.raises(Refused) as e:
        Evictor(client, timeout=0.3, retry=0.05, stop=threading.Event()).evict([("ns", "b"), ("ns", "c")])
    assert list(e.value.pods) == ["ns/b"] and "disruption budget" in e.value.pods["ns/b"]
    assert ("ns", "c") in server.objects.evicted


def test_the_test_api_server_keeps_leases_with_resource_versions():
    server = TestApiServer((1, 35))
    lease = server.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": "upgrade-0", "namespace": "hostagent"},
                           "spec": {"holderIdentity": "n", "leaseDurationSeconds": 15}})
    with server._cond:
        stale = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "0"}}
        code, _ = server.objects.replace("leases", "hostagent", "upgrade-0", stale)
        assert code == 409
        code, new = server.objects.replace("leases", "hostagent", "upgrade-0",
                                           {**lease, "spec": {**lease["spec"], "holderIdentity": "m"}})
        assert code == 200 and new["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]
        code, _ = server.objects.create("leases", "hostagent", {"apiVersion": "coordination.k8s.io/v1",
                                                                 "kind": "Lease", "metadata": {"name": "bad"},
                                                                 "spec": {"leaseDurationSeconds": "x"}})
    assert code == 422 and server.rejected
