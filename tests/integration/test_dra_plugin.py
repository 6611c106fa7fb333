"""The DRA plugin against a test kubelet, a test API server and the real agent on a
simulated DGX A100: registration, the published pool, NVIDIA's quickstart claims allocated
by the test scheduler and prepared, bad claims, health, kubelet and plugin restarts, an API
server away.

One cluster for the module (``hostagent dra-plugin`` as a child process); each test leaves
it as it found it (no claim, no allocation, every device healthy).
"""

import os
import time

import grpc
import pytest
import yaml

from hostagent.sim.control import inject_xid
from hostagent.sim.store import SimStore

from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .dracluster import DRIVER, NODE, Cluster, quickstart

pytest.importorskip("celpy", reason="cel-python is in the [test] extra")

DEMOS = quickstart()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        c.start()
        c.kubelet.plugin()
        c.devices()
        with c.agent.client() as client:
            c.gpus = client.devices()["gpus"]
        yield c
        assert c.stop_plugin() == 0
        assert not list(c.kubelet.registry.glob("*.sock")), "the plugin left its registration socket"
    except BaseException:
        print(c.plugin_log()[-6000:])
        raise
    finally:
        c.close()


@pytest.fixture(autouse=True)
def clean(cluster):
    yield
    assert cluster.allocations() == [], "a test left an allocation"
    assert not cluster.api.rejected, cluster.api.rejected


def names(prepared):
    return [device for _, _, device, _ in prepared]


def test_registration_and_a_pool_of_every_gpu(cluster):
    p = cluster.kubelet.plugin()
    assert (p.info.type, p.info.name) == ("DRAPlugin", DRIVER)
    assert p.info.endpoint == str(cluster.work / "plugins" / DRIVER / "dra.sock")
    assert list(p.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                               "v1alpha1.DRAResourceHealth"]
    assert (p.dra_version, p.health_version) == ("v1.DRAPlugin", "v1.DRAResourceHealth")
    devices = cluster.devices()
    assert list(devices) == [f"gpu-{g['minor']}" for g in cluster.gpus]
    [slice_] = cluster.api.pool(DRIVER, NODE)
    assert slice_["spec"]["nodeName"] == NODE and slice_["spec"]["pool"]["resourceSliceCount"] == 1
    assert slice_["metadata"]["ownerReferences"][0]["uid"] == cluster.api.nodes[NODE]["metadata"]["uid"]
    health = p.wait_health(lambda entries: len(entries) == 8)
    assert {(pool, device, status) for pool, device, status, *_ in health} == {
        (NODE, name, "HEALTHY") for name in devices}
    assert {timeout for *_, timeout in health} == {30}


@pytest.mark.parametrize("demo", ["gpu-test1", "gpu-test2", "gpu-test3"])
def test_quickstart_whole_gpu_claims_are_prepared_and_unprepared(cluster, demo):
    claims = cluster.allocate(cluster.claims(DEMOS[demo]))
    try:
        answers = cluster.kubelet.prepare(*claims)
        assert set(answers) == {c["metadata"]["uid"] for c in claims}
        assert all(not error for _, error in answers.values()), answers
        prepared = [d for devices, _ in answers.values() for d in devices]
        assert len(prepared) == len(claims) and len(set(names(prepared))) == len(claims)   # distinct GPUs
        known = cluster.cdi_devices()
        for requests, pool, device, cdi in prepared:
            assert requests == ("gpu",) and pool == NODE and device in cluster.devices()
            assert len(cdi) == 1 and cdi[0] in known, (cdi, sorted(known)[:5])
        # One agent allocation per claim, named after its uid, of the device the claim got.
        allocations = {a["id"]: a for a in cluster.allocations()}
        by_name = {f"gpu-{g['minor']}": g["uuid"] for g in cluster.gpus}
        for c in claims:
            a = allocations[f"k8s-dra/{c['metadata']['uid']}"]
            [(_, _, device, _)] = answers[c["metadata"]["uid"]][0]
            assert a["devices"] == [by_name[device]] and a["labels"]["claim_uid"] == c["metadata"]["uid"]
        # The kubelet retries: the same answer.
        assert cluster.kubelet.prepare(*claims) == answers
    finally:
        cluster.forget(claims)
    assert cluster.allocations() == []
    # Unprepared already (or never prepared): done.
    assert cluster.kubelet.unprepare(*claims) == {c["metadata"]["uid"]: "" for c in claims}


@GPU_CHANGES                    # time-slices
def test_quickstart_gpu_test6_picks_even_a100s_by_index_and_time_slices_them(cluster):
    claims = cluster.allocate(cluster.claims(DEMOS["gpu-test6"]))
    try:
        devices = cluster.devices()
        picked = [r["device"] for c in claims for r in c["status"]["allocation"]["devices"]["results"]]
        assert sorted(devices[d]["attributes"]["index"]["int"] for d in picked) == [0, 2, 4, 6]
        answers = cluster.kubelet.prepare(*claims)
        assert all(not error for _, error in answers.values()), answers
        for a in cluster.allocations():
            assert list(a["device_sharing"].values()) == [
                {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}]
        # The GPUs' time-slice is Long (3) while the claims hold them, Default (0) after.
        assert [g.timeslice for g in SimStore(cluster.root).read().gpus] == [3, 0, 3, 0, 3, 0, 3, 0]
    finally:
        cluster.forget(claims)
    assert [g.timeslice for g in SimStore(cluster.root).read().gpus] == [0] * 8


def test_a_claim_that_does_not_fit_gets_an_error_naming_what_and_leaves_nothing(cluster):
    [claim] = cluster.allocate(cluster.claims(DEMOS["gpu-test1"], 1))
    uid = claim["metadata"]["uid"]
    ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
    try:
        answers = cluster.kubelet.prepare((ns, "00000000-0000-0000-0000-000000000000", name),
                                          ("gpu-test1", "11111111-1111-1111-1111-111111111111", "nowhere"))
        errors = sorted(error for _, error in answers.values())
        assert "does not exist" in errors[0] and "nowhere" in errors[0]
        assert "has uid " + uid in errors[1] and "deleted and made again" in errors[1]
        results = claim["status"]["allocation"]["devices"]["results"]
        for change, words in ((dict(device="gpu-99"), "results[0].device: 'gpu-99' is not published"),
                              (dict(pool="node-2"), "results[0].pool: 'node-2' is not this node's pool"),
                              (dict(driver="nic.example.com", device="eth0"),
                               f"results: no device of driver {DRIVER} (only of nic.example.com)")):
            bad = {**claim, "status": {"allocation": {**claim["status"]["allocation"],
                                                      "devices": {"results": [{**results[0], **change}]}}}}
            cluster.api.put_claim(bad)
            [(devices, error)] = cluster.kubelet.prepare(claim).values()
            assert not devices and words in error, error
        for sharing, words in (({"strategy": "Turbo"}, "sharing.strategy: \"Turbo\" is not one of"),
                               ({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}},
                                "defaultActiveThreadPercentage: 150 is not between 0 and 100")):
            config = [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}]
            bad = {**claim, "status": {"allocation": {**claim["status"]["allocation"],
                                                      "devices": {"results": results, "config": config}}}}
            cluster.api.put_claim(bad)
            [(devices, error)] = cluster.kubelet.prepare(claim).values()
            assert not devices and words in error, error
        assert cluster.allocations() == []
    finally:
        cluster.forget([claim])


def test_an_xid_reaches_the_kubelets_health_stream_within_two_seconds(cluster):
    p = cluster.kubelet.plugin()
    name = f"gpu-{cluster.gpus[2]['minor']}"
    p.wait_health(lambda entries: all(status == "HEALTHY" for _, _, status, *_ in entries))
    started = time.monotonic()
    inject_xid(SimStore(cluster.root), 2, 79)
    try:
        entries = p.wait_health(lambda e: any(status == "UNHEALTHY" for _, _, status, *_ in e), timeout=10)
        took = time.monotonic() - started
        assert [(device, status) for _, device, status, *_ in entries if status != "HEALTHY"] == [
            (name, "UNHEALTHY")]
        assert "79" in next(message for _, device, _, message, *_ in entries if device == name)
        assert took < 2.0, f"{took:.2f} s"
    finally:
        with cluster.agent.client() as c:
            c.clear_health(["2"])
    p.wait_health(lambda entries: all(status == "HEALTHY" for _, _, status, *_ in entries))


def test_a_kubelet_restart_registers_the_plugin_again_and_its_slices_come_back(cluster):
    before = cluster.kubelet.plugin().number
    cluster.kubelet.restart(recreate=True)          # its registry folder made anew; the node's slices deleted
    p = cluster.kubelet.plugin(after=before + 1)
    assert p.dra_version == "v1.DRAPlugin"
    assert len(cluster.devices()) == 8
    p.wait_health(lambda entries: len(entries) == 8)


def test_a_plugin_restart_changes_nothing_in_the_cluster(cluster):
    [claim] = cluster.allocate(cluster.claims(DEMOS["gpu-test1"], 1))
    try:
        first = cluster.kubelet.prepare(claim)
        writes, before = cluster.api.writes, cluster.kubelet.plugin().number
        assert cluster.stop_plugin() == 0
        cluster.start_plugin()
        cluster.kubelet.plugin(after=before + 1)
        lists = len(cluster.api.requests)
        # Past its first comparison of the slices (and one resync more): nothing written.
        until(lambda: sum(1 for m, path, q in cluster.api.requests[lists:]
                         if m == "GET" and path.endswith("/resourceslices") and q.get("watch") != "true") >= 2,
             what="two comparisons of the slices")
        assert cluster.api.writes == writes
        assert cluster.kubelet.prepare(claim) == first
    finally:
        cluster.forget([claim])


def test_an_agent_restart_answers_the_same_and_changes_nothing_in_the_cluster(cluster):
    """The agent away: its devices Unknown to the kubelet, the pool as it was; back (after a
    kill -9), the prepared claim answers the same from its checkpoint, and no slice is written."""
    p = cluster.kubelet.plugin()
    claims = cluster.allocate(cluster.claims(DEMOS["gpu-test1"], 2))
    try:
        first = cluster.kubelet.prepare(claims[0])
        writes = cluster.api.writes
        cluster.agent.kill()
        entries = p.wait_health(lambda e: len(e) == 8 and all(status == "UNKNOWN" for _, _, status, *_ in e))
        assert "not reachable" in entries[0][3]
        [(devices, error)] = cluster.kubelet.prepare(claims[1]).values()
        assert not devices and "the hostagent daemon is not running" in error, error
        cluster.agent.start()
        p.wait_health(lambda e: len(e) == 8 and all(status == "HEALTHY" for _, _, status, *_ in e))
        assert cluster.kubelet.prepare(claims[0]) == first
        lists = len(cluster.api.requests)
        until(lambda: sum(1 for m, path, q in cluster.api.requests[lists:]
                         if m == "GET" and path.endswith("/resourceslices") and q.get("watch") != "true") >= 1,
             what="a comparison of the slices")
        assert cluster.api.writes == writes
    finally:
        cluster.forget(claims)


def test_an_older_kubelet_speaks_v1beta1_and_v1alpha1_health(cluster):
    cluster.kubelet.stop()
    old = type(cluster.kubelet)(cluster.kubelet.registry, cluster.api, NODE, dra_versions=("v1beta1.DRAPlugin",),
                                health_versions=("v1alpha1.DRAResourceHealth",))
    old.start()                                     # it deletes the node's slices, as a starting kubelet does
    claim = None
    try:
        p = old.plugin()
        assert (p.dra_version, p.health_version) == ("v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
        p.wait_health(lambda entries: len(entries) == 8)
        cluster.devices()
        [claim] = cluster.allocate(cluster.claims(DEMOS["gpu-test1"], 1))
        [(devices, error)] = old.prepare(claim).values()
        assert not error and len(devices) == 1
        assert old.unprepare(claim) == {claim["metadata"]["uid"]: ""}
    finally:
        old.stop()
        if claim is not None:
            cluster.api.delete_claim(claim["metadata"]["namespace"], claim["metadata"]["name"])
        cluster.kubelet.start()
        cluster.kubelet.plugin()
        cluster.devices()


def test_with_the_api_server_away_prepare_fails_and_the_slices_come_back_after(cluster):
    [claim] = cluster.allocate(cluster.claims(DEMOS["gpu-test1"], 1))
    try:
        cluster.api.stop()
        [(devices, error)] = cluster.kubelet.prepare(claim).values()
        assert not devices and "not reachable" in error
        cluster.api.delete_slices(NODE)             # what happened meanwhile
        cluster.api.start()
        assert len(cluster.devices()) == 8          # published again once it is back
        [(devices, error)] = cluster.kubelet.prepare(claim).values()
        assert not error and len(devices) == 1
    finally:
        cluster.forget([claim])


def test_a_plugin_started_with_the_api_server_away_publishes_once_it_is_back(cluster):
    before = cluster.kubelet.plugin().number
    assert cluster.stop_plugin() == 0
    cluster.api.stop()
    cluster.api.delete_slices(NODE)
    cluster.start_plugin()
    try:
        cluster.kubelet.plugin(after=before + 1)        # registered meanwhile
        assert cluster.proc.poll() is None
    finally:
        cluster.api.start()
    assert len(cluster.devices()) == 8
    [slice_] = cluster.api.pool(DRIVER, NODE)
    assert slice_["metadata"]["ownerReferences"][0]["uid"] == cluster.api.nodes[NODE]["metadata"]["uid"]


def test_claims_of_the_wrong_shape_get_an_error_of_their_own_and_the_others_are_prepared(cluster):
    """Opaque parameters are any JSON a claim's author writes: a kind that is a list,
    parameters that are a string, requests that are a number, a pinned limit of 1e999999999
    bytes or above the GPU's memory. Each fails its own claim, naming the field, in the same
    NodePrepareResources call that prepares a good claim (it was INTERNAL for the call)."""
    good, *bad = cluster.allocate(cluster.claims(DEMOS["gpu-test1"], 7))

    def params(kind="GpuConfig", sharing=None):
        return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, **({"sharing": sharing} if sharing else {})}
    mps = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1e999999999"}}
    cases = [({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params(["GpuConfig"])}},
              'parameters.kind: ["GpuConfig"] is not GpuConfig, MigDeviceConfig or VfioDeviceConfig'),
             ({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": "GpuConfig"}},
              "cannot be read: Expected `object`, got `str` - at `$.status.allocation.devices.config[0].opaque"
              ".parameters`"),
             ({"source": "FromClaim", "requests": 5, "opaque": {"driver": DRIVER, "parameters": params()}},
              "cannot be read: Expected `array | null`, got `int` - at `$.status.allocation.devices.config[0]"
              ".requests`"),
             ({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params(sharing=mps)}},
              "defaultPinnedDeviceMemoryLimit: '1e999999999' is too large"),
             ({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params(sharing={
                 "strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1e400"}})}},
              "defaultPinnedDeviceMemoryLimit: '1e400' is too large"),
             ({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params(sharing={
                 "strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "41Gi"}})}},
              "defaultPinnedDeviceMemoryLimit: 41984Mi is more than the 40960Mi of device gpu-")]
    try:
        for claim, (config, _) in zip(bad, cases):
            cluster.api.put_claim({**claim, "status": {"allocation": {**claim["status"]["allocation"], "devices": {
                "results": claim["status"]["allocation"]["devices"]["results"], "config": [config]}}}})
        answers = cluster.kubelet.prepare(good, *bad)
        assert answers[good["metadata"]["uid"]][1] == "" and len(answers[good["metadata"]["uid"]][0]) == 1
        for claim, (_, words) in zip(bad, cases):
            devices, error = answers[claim["metadata"]["uid"]]
            assert not devices and words in error, error
        assert [a["id"] for a in cluster.allocations()] == [f"k8s-dra/{good['metadata']['uid']}"]
    finally:
        cluster.forget([good, *bad])


def test_the_services_answer_errors_not_crashes(cluster):
    p = cluster.kubelet.plugin()
    # An empty request is a valid one (the kubelet's liveness check sends it).
    assert p.stub.NodePrepareResources(p.api.NodePrepareResourcesRequest(), timeout=10).claims == {}
    with pytest.raises(grpc.RpcError) as e:
        grpc.insecure_channel(f"unix:{p.info.endpoint}").unary_unary(
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Nope")(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_driver_being_changed_empties_the_pool_and_every_device_turns_unhealthy(cluster):
    p = cluster.kubelet.plugin()
    with cluster.agent.client() as c:
        c.request("POST", "/v1/driver/maintenance", {"pid": os.getpid(), "operation": "driver install (test)"})
        try:
            entries = p.wait_health(lambda e: e and all(status == "UNHEALTHY" for _, _, status, *_ in e))
            assert len(entries) == 8 and "maintenance" in entries[0][3]
            until(lambda: cluster.api.complete(DRIVER, NODE) and not cluster.devices(), what="an empty pool")
        finally:
            c.request("DELETE", "/v1/driver/maintenance")
    until(lambda: len(cluster.devices()) == 8, what="the GPUs published again")
    p.wait_health(lambda e: len(e) == 8 and all(status == "HEALTHY" for _, _, status, *_ in e))


@GPU_CHANGES                            # the MPS daemon's GPUs in EXCLUSIVE_PROCESS
@pytest.mark.parametrize("demo", ["gpu-test5", "gpu-test-mps"])
def test_quickstart_mps_and_time_sliced_claims_get_a_daemon_of_their_own(cluster, demo):
    from hostagent.sharing import mps

    from .mpsprocs import running
    claims = cluster.allocate(cluster.claims(DEMOS[demo]))
    try:
        answers = cluster.kubelet.prepare(*claims)
        assert all(not error for _, error in answers.values()), answers
        [alloc] = cluster.allocations()
        devices = cluster.devices()
        [(prepared, _)] = answers.values()
        by_request = {requests[0]: (device, cdi[0]) for requests, _, device, cdi in prepared}
        uuid = {r: devices[d]["attributes"]["uuid"]["string"] for r, (d, _) in by_request.items()}
        # The MPS device has the claim's daemon, with the claim's limits; its CDI device gives
        # the client the daemon's socket and the limits.
        assert alloc["mps"]["devices"] == [uuid["mps-gpu"]]
        assert alloc["device_sharing"][uuid["mps-gpu"]]["mpsConfig"] == {
            "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10240Mi"}
        assert mps.ask(cluster.agent.host, alloc["mps"]["key"], ["get_default_active_thread_percentage"]) == ["50.0"]
        spec = yaml.safe_load(open(alloc["spec_path"]).read())
        edits = {f"{spec['kind']}={d['name']}": d["containerEdits"] for d in spec["devices"]}
        mps_edits = edits[by_request["mps-gpu"][1]]
        assert {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"} <= set(
            mps_edits["env"])
        mounts = {m["containerPath"]: m for m in mps_edits["mounts"]}
        assert "ro" in mounts["/tmp/nvidia-mps"]["options"]
        assert mounts["/tmp/nvidia-mps"]["hostPath"].startswith(str(cluster.root / "run/hostagent/mps/alloc-"))
        assert "/dev/shm" in mounts
        # Every CDI device id answered resolves in a spec of the node's spec folders.
        known = cluster.cdi_devices()
        assert all(cdi[0] in known for *_, cdi in prepared), (prepared, sorted(known)[-3:])
        if demo == "gpu-test5":
            # The time-sliced device: interval Long (3) on its GPU, and no MPS for its containers.
            ts = edits[by_request["ts-gpu"][1]]
            assert not any(m["containerPath"] == "/tmp/nvidia-mps" for m in ts.get("mounts", ()))
            index = devices[by_request["ts-gpu"][0]]["attributes"]["index"]["int"]
            assert SimStore(cluster.root).read().gpus[index].timeslice == 3
    finally:
        cluster.forget(claims)
    assert running(cluster.root) == []
    assert [g.timeslice for g in SimStore(cluster.root).read().gpus] == [0] * 8
