"""``hostagent node-controller`` against the test API server with one Node and the real agent
on a simulated DGX A100: MIG layouts and sharing chosen by node labels with their state
reported back, devices in use waited for, failed on or evicted, GPU faults as Events, the
GPUUnhealthy condition and the taint; the API server or the agent away; nothing asked of
the API server at rest but the watch. Every object the controller writes is checked against
Kubernetes' schema by the test API server (``rejected`` stays empty)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from hostagent.sim import control
from hostagent.sim.store import SimStore
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .dracluster import NODE, Cluster

pytestmark = GPU_CHANGES

AGENT = {"api": {"watch_heartbeat": 2}, "daemon": {"resync_interval": 0},
         "health": {"quiet_period": None, "wait_timeout_ms": 200}}
MIG_FILE = {"version": "v1", "mig-configs": {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "all-1g.5gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
    "all-3g.20gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
    "too-big": [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.40gb": 2}}]}}
SLICE = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 0}]}}}
MIG, MIG_STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
SHARING, SHARING_STATE = "nvidia.com/device-plugin.config", "nvidia.com/device-plugin.config.state"


def slicing(replicas: int) -> str:
    doc = json.loads(json.dumps(SLICE))
    doc["sharing"]["timeSlicing"]["resources"][0]["replicas"] = replicas
    return json.dumps(doc)


def configmap_folder(folder: Path, files: dict[str, str]) -> Path:
    """A ConfigMap volume's layout: ``..data`` a link to a timestamped folder, each key a
    link through it; written again as the kubelet updates it (one rename)."""
    folder.mkdir(exist_ok=True)
    stamp = folder / f"..{time.time_ns()}"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text)
    (folder / "..data_tmp").symlink_to(stamp.name)
    os.replace(folder / "..data_tmp", folder / "..data")
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    return folder


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(dra_plugin=False, agent_config=AGENT)
    try:
        c.start()
        c.files = tmp_path_factory.mktemp("node-controller")
        (c.files / "mig.yaml").write_text(json.dumps(MIG_FILE))
        c.sharing = configmap_folder(c.files / "sharing", {"default": slicing(2), "slice-4": slicing(4)})
        yield c
    finally:
        c.close()


@pytest.fixture
def node(cluster):
    """A node at rest: MIG off, no sharing, no labels, conditions or Events of ours, and no
    controller running; the controller's log and what it asked of the API server shown when
    the test fails."""
    c = cluster
    if not c.agent.proc or c.agent.proc.poll() is not None:
        c.agent.start()
    if not c.api.up:
        c.start_api()
    with c.agent.client(timeout=None) as a:
        for alloc in a.allocations():
            a.release(alloc["id"])
        a.clear_health()
        a.sharing_apply(None)
        a.mig_apply("all-disabled", spec=MIG_FILE)
    current = c.api.get("nodes", NODE)
    c.api.label_node(NODE, {k: None for k in (current["metadata"].get("labels") or {})})
    with c.api._cond:
        n = c.api.nodes[NODE]
        n["status"]["conditions"], n["spec"] = [], {}
        n["metadata"].pop("annotations", None)
        c.api.objects.store["events"].clear()
        c.api.objects.store["pods"].clear()
        c.api.objects.blocked.clear()
        c.api.objects.evicted.clear()
        c.api.objects.on_delete.clear()
    c.api.rejected.clear()
    c.controller_log_path.write_text("")
    yield c
    if c.controller is not None and c.controller.poll() is None:
        c.stop_controller()
    assert not c.api.rejected, c.api.rejected


def labels(c) -> dict:
    return c.api.get("nodes", NODE)["metadata"].get("labels") or {}


def state_history(c, key: str = MIG_STATE) -> list[str]:
    """The values ``key`` took, in order, as the watch saw the Node change."""
    out = []
    with c.api._cond:
        events = [o for _, r, _, o in c.api._events if r == "nodes"]
    for obj in events:
        value = (obj["metadata"].get("labels") or {}).get(key) or ""
        if not out or out[-1] != value:
            out.append(value)
    return out


def settled(c, key: str, timeout: float = 30, after: int = 0) -> str:
    """The first final state ``key`` took after its first ``after`` values."""
    def final():
        return next((v for v in state_history(c, key)[after:] if v in ("success", "failed")), None)
    return until(final, timeout=timeout, what=lambda: f"{key} is {labels(c).get(key)!r}:\n{c.controller_log()[-3000:]}")


def relabel(c, values: dict, key: str = MIG_STATE) -> int:
    """Set the labels; the number of values ``key`` had taken before (for ``settled``)."""
    before = len(state_history(c, key))
    c.api.label_node(NODE, values)
    return before


def events(c, reason: str | None = None) -> list[dict]:
    return [e for e in c.api.events(NODE) if reason is None or e["reason"] == reason]


def mig_profiles(c) -> list[str]:
    with c.agent.client() as a:
        return sorted(m["profile"] for m in a.devices(type="mig")["mig_devices"])


def start(c, *args: str):
    return c.start_controller("--mig-config", str(c.files / "mig.yaml"), *args)


# ---- MIG by label -------------------------------------------------------------------------

def test_the_mig_label_gives_pending_then_success_with_the_layout_in_place(node):
    start(node)
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    assert mig_profiles(node) == ["1g.5gb"] * 56
    assert state_history(node)[mark:] == ["pending", "success"]
    [applied] = events(node, "MIGConfigApplied")
    assert applied["type"] == "Normal" and "all-1g.5gb" in applied["message"]
    assert applied["involvedObject"]["uid"] == node.api.nodes[NODE]["metadata"]["uid"]


def test_an_unknown_name_fails_with_an_event_naming_it_and_the_configs_there_are(node):
    start(node)
    mark = relabel(node, {MIG: "3g.20gb-2x2g.10gb"})
    assert settled(node, MIG_STATE, after=mark) == "failed"
    [event] = events(node, "MIGConfigFailed")
    assert event["type"] == "Warning"
    assert "'3g.20gb-2x2g.10gb'" in event["message"] and "all-1g.5gb" in event["message"]
    assert mig_profiles(node) == []


def test_a_config_that_does_not_fit_the_node_fails_with_the_agents_reason(node):
    start(node)
    mark = relabel(node, {MIG: "too-big"})
    assert settled(node, MIG_STATE, after=mark) == "failed"
    [event] = events(node, "MIGConfigFailed")
    assert "'too-big'" in event["message"] and "7g.40gb" in event["message"]
    assert mig_profiles(node) == []


def test_without_the_flag_the_agents_own_configs_answer_to_nvidias_names(node):
    node.start_controller()
    mark = relabel(node, {MIG: "all-balanced"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    assert "3g.20gb" in mig_profiles(node)


def test_a_change_that_would_destroy_an_allocated_mig_device_waits_until_it_is_released(node):
    start(node)
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    with node.agent.client() as a:
        held = a.allocate("k8s-dra/claim-1", [{"constraints": {"profile": "1g.5gb"}}],
                          labels={"claim": "team/train"})["devices"][0]
    mark = relabel(node, {MIG: "all-3g.20gb"})
    waiting = until(lambda: events(node, "MIGConfigWaiting"), timeout=15, what="the waiting Event")
    assert "k8s-dra/claim-1" in waiting[0]["message"] and held in waiting[0]["message"]
    assert labels(node)[MIG_STATE] == "pending"
    assert mig_profiles(node) == ["1g.5gb"] * 56
    with node.agent.client() as a:
        a.release("k8s-dra/claim-1")
    assert settled(node, MIG_STATE, after=mark) == "success"
    assert mig_profiles(node) == ["3g.20gb"] * 16, (state_history(node)[mark:], node.controller_log())
    assert len(events(node, "MIGConfigWaiting")) == 1


def test_on_busy_fail_fails_at_once_naming_what_is_in_the_way(node):
    start(node, "--on-busy", "fail")
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    with node.agent.client() as a:
        a.allocate("api-user", [{"constraints": {"profile": "1g.5gb"}}])
    node.api.label_node(NODE, {MIG: "all-disabled"})
    until(lambda: labels(node).get(MIG_STATE) == "failed", timeout=15, what="failed")
    assert "api-user" in events(node, "MIGConfigFailed")[0]["message"]
    assert mig_profiles(node) == ["1g.5gb"] * 56


def test_on_busy_evict_cordons_evicts_through_the_disruption_budget_applies_and_uncordons(node):
    start(node, "--on-busy", "evict")
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    with node.agent.client() as a:
        a.allocate("k8s-dra/uid-1", [{"constraints": {"profile": "1g.5gb"}}], labels={"claim": "team/train-gpu"})
    node.api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team"},
                     "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "cuda"}],
                              "resourceClaims": [{"name": "gpu", "resourceClaimName": "train-gpu"}]}})
    node.api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": "team"},
                     "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "cuda"}]}})
    node.api.objects.blocked[("team", "train")] = 1            # the budget allows it on the second try
    cordoned = []

    def kubelet(resource, obj):             # the pod gone: its claim unprepared, its allocation released
        if resource == "pods" and obj["metadata"]["name"] == "train":
            cordoned.append(node.api.nodes[NODE]["spec"].get("unschedulable"))
            with node.agent.client() as a:
                a.release("k8s-dra/uid-1")
    node.api.objects.on_delete.append(kubelet)
    mark = relabel(node, {MIG: "all-3g.20gb"})
    assert settled(node, MIG_STATE, timeout=40, after=mark) == "success"
    assert node.api.objects.evicted == [("team", "train")] and cordoned == [True], node.controller_log()
    assert node.api.get("pods", "other", "team") is not None
    after = node.api.get("nodes", NODE)
    assert not after["spec"].get("unschedulable") and "hostagent.io/cordoned-by" not in (
        after["metadata"].get("annotations") or {})
    assert mig_profiles(node) == ["3g.20gb"] * 16
    assert {"Cordoned", "Evicted", "Uncordoned"} <= {e["reason"] for e in events(node)}


def train_pod_holding_an_allocation(c, alloc_id: str = "k8s-dra/uid-1") -> None:
    """A DRA allocation of a 1g.5gb device, and the pod holding its claim."""
    with c.agent.client() as a:
        a.allocate(alloc_id, [{"constraints": {"profile": "1g.5gb"}}], labels={"claim": "team/train-gpu"})
    c.api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team"},
                  "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "cuda"}],
                           "resourceClaims": [{"name": "gpu", "resourceClaimName": "train-gpu"}]}})


def evictions(c) -> int:
    return sum(1 for method, url, _ in c.api.requests if method == "POST" and url.endswith("/eviction"))


EVICTION_STARTED = "hostagent.io/mig.config.eviction-started"


def test_a_controller_killed_mid_eviction_goes_on_with_the_time_left_of_its_timeout(node):
    """The budget never lets the pod go. The controller is killed 6 s into a 10 s eviction
    timeout and started again once the 10 s are over: the time is up, counted from when the
    evictions began (the Node keeps it), so the change fails at once, with no new round of
    evictions, and its cordon is lifted."""
    start(node, "--on-busy", "evict", "--eviction-timeout", "10")
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    train_pod_holding_an_allocation(node)
    node.api.objects.blocked[("team", "train")] = None
    before = evictions(node)
    mark = relabel(node, {MIG: "all-3g.20gb"})
    until(lambda: evictions(node) > before, timeout=15, interval=0.01, what="the first eviction")
    began = time.time()
    assert node.api.get("nodes", NODE)["spec"]["unschedulable"] is True
    until(lambda: time.time() >= began + 6, timeout=15, what="6 s of evictions")
    node.controller.send_signal(signal.SIGKILL)
    node.controller.wait()
    refused = evictions(node)
    until(lambda: time.time() >= began + 10.5, timeout=15, what="the timeout over")
    start(node, "--on-busy", "evict", "--eviction-timeout", "10")
    assert settled(node, MIG_STATE, after=mark) == "failed"
    assert "not released within 10 s of the eviction" in events(node, "MIGConfigFailed")[0]["message"]
    assert evictions(node) == refused
    after = node.api.get("nodes", NODE)
    assert not after["spec"].get("unschedulable") and not {"hostagent.io/cordoned-by", EVICTION_STARTED} & set(
        after["metadata"].get("annotations") or {})
    assert mig_profiles(node) == ["1g.5gb"] * 56


def test_a_controller_killed_after_its_evictions_lifts_its_cordon_once_restarted(node):
    """Killed as the pod goes (before the change is applied): the one started next finds
    the devices free, applies the change, and lifts the cordon the first one made."""
    start(node, "--on-busy", "evict")
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    train_pod_holding_an_allocation(node)

    def kubelet(resource, obj):             # the pod gone: its allocation released, the controller killed
        if resource == "pods" and obj["metadata"]["name"] == "train":
            node.controller.send_signal(signal.SIGKILL)
            with node.agent.client() as a:
                a.release("k8s-dra/uid-1")
    node.api.objects.on_delete.append(kubelet)
    mark = relabel(node, {MIG: "all-3g.20gb"})
    until(lambda: node.controller.poll() is not None, timeout=30, what="the controller killed as the pod went")
    assert node.api.get("nodes", NODE)["spec"]["unschedulable"] is True
    start(node, "--on-busy", "evict")
    assert settled(node, MIG_STATE, after=mark) == "success"
    assert mig_profiles(node) == ["3g.20gb"] * 16
    after = node.api.get("nodes", NODE)
    assert not after["spec"].get("unschedulable") and not {"hostagent.io/cordoned-by", EVICTION_STARTED} & set(
        after["metadata"].get("annotations") or {})


def test_an_allocation_in_the_way_made_during_the_evictions_has_its_pod_evicted_too(node):
    """A pod bound before the cordon starts as the first goes, and takes a device the change
    destroys: its pod is evicted too, and the change made (not left waiting for the timeout)."""
    start(node, "--on-busy", "evict")
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    train_pod_holding_an_allocation(node)

    def kubelet(resource, obj):
        name = obj["metadata"]["name"] if resource == "pods" else None
        if name == "train":                 # the next pod starts on the device it frees
            with node.agent.client() as a:
                a.release("k8s-dra/uid-1")
                a.allocate("k8s-dra/uid-2", [{"constraints": {"profile": "1g.5gb"}}], labels={"claim": "team/late-gpu"})
            node.api.objects.create("pods", "team", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": "team"},
                "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "cuda"}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": "late-gpu"}]}})
        elif name == "late":
            with node.agent.client() as a:
                a.release("k8s-dra/uid-2")
    node.api.objects.on_delete.append(kubelet)
    mark = relabel(node, {MIG: "all-3g.20gb"})
    assert settled(node, MIG_STATE, timeout=40, after=mark) == "success"
    assert node.api.objects.evicted == [("team", "train"), ("team", "late")]
    assert mig_profiles(node) == ["3g.20gb"] * 16 and not node.api.get("nodes", NODE)["spec"].get("unschedulable")


def test_a_node_cordoned_by_its_admin_stays_cordoned_after_an_eviction(node):
    node.api.patch("nodes", NODE, {"spec": {"unschedulable": True}})
    start(node, "--on-busy", "evict")
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    train_pod_holding_an_allocation(node)

    def kubelet(resource, obj):
        if resource == "pods" and obj["metadata"]["name"] == "train":
            with node.agent.client() as a:
                a.release("k8s-dra/uid-1")
    node.api.objects.on_delete.append(kubelet)
    mark = relabel(node, {MIG: "all-3g.20gb"})
    assert settled(node, MIG_STATE, timeout=40, after=mark) == "success"
    assert node.api.objects.evicted == [("team", "train")] and mig_profiles(node) == ["3g.20gb"] * 16
    after = node.api.get("nodes", NODE)
    assert after["spec"]["unschedulable"] is True and "hostagent.io/cordoned-by" not in (
        after["metadata"].get("annotations") or {})
    assert not events(node, "Cordoned") and not events(node, "Uncordoned")


def test_an_allocation_no_pod_holds_fails_the_change_naming_it_and_the_admins_cordon_stays(node):
    node.api.patch("nodes", NODE, {"spec": {"unschedulable": True}})
    start(node, "--on-busy", "evict")
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    with node.agent.client() as a:
        a.allocate("by-hand", [{"constraints": {"profile": "1g.5gb"}}])
    mark = relabel(node, {MIG: "all-disabled"})
    assert settled(node, MIG_STATE, timeout=20, after=mark) == "failed"           # no pod holds it: said so
    assert "by-hand" in events(node, "MIGConfigFailed")[0]["message"]
    assert node.api.get("nodes", NODE)["spec"]["unschedulable"] is True


def test_a_label_that_flaps_is_applied_at_its_last_value_with_no_queue(node):
    start(node)
    until(lambda: node.api.condition(NODE, "GPUUnhealthy"), timeout=15, what="the controller's start")
    for name in ("all-1g.5gb", "all-disabled", "all-1g.5gb", "all-disabled", "all-3g.20gb"):
        node.api.label_node(NODE, {MIG: name})
    until(lambda: mig_profiles(node) == ["3g.20gb"] * 16, timeout=30, what="the last value's layout")
    until(lambda: labels(node).get(MIG_STATE) == "success", timeout=15, what="success")
    assert len(events(node, "MIGConfigApplied")) <= 2


def test_a_bad_file_is_one_line_and_an_event_and_a_fixed_file_is_read_again(node):
    bad = node.files / "bad-mig.yaml"
    bad.write_text("version: v1\nmig-configs:\n  x: [{devices: all, mig-enabled: maybe}]\n")
    node.start_controller("--mig-config", str(bad))
    mark = relabel(node, {MIG: "x"})
    assert settled(node, MIG_STATE, after=mark) == "failed"
    assert events(node, "NodeControllerConfigInvalid")[0]["message"].startswith(str(bad))
    assert str(bad) in events(node, "MIGConfigFailed")[0]["message"]
    assert [line for line in node.controller_log().splitlines() if "error:" in line][0].count(str(bad)) == 1
    assert mig_profiles(node) == []
    bad.write_text(json.dumps({"version": "v1", "mig-configs": {"x": MIG_FILE["mig-configs"]["all-3g.20gb"]}}))
    until(lambda: labels(node).get(MIG_STATE) == "success", timeout=20, what="the fixed file applied")
    assert mig_profiles(node) == ["3g.20gb"] * 16


# ---- sharing by label -----------------------------------------------------------------------

def replicas(c) -> list[int]:
    with c.agent.client() as a:
        return [len(g["replicas"]) for g in a.devices(type="gpu")["gpus"]]


def test_the_sharing_label_picks_a_named_config_and_without_it_the_default_is_back(node):
    start(node, "--sharing-configs", str(node.sharing))
    assert settled(node, SHARING_STATE) == "success"
    assert replicas(node) == [2] * 8                       # no label: the config named default
    mark = relabel(node, {SHARING: "slice-4"}, SHARING_STATE)
    until(lambda: replicas(node) == [4] * 8, timeout=20, what="4 replicas per GPU")
    assert settled(node, SHARING_STATE, after=mark) == "success"
    node.api.label_node(NODE, {SHARING: None})
    until(lambda: replicas(node) == [2] * 8, timeout=20, what="the default config back")
    node.api.label_node(NODE, {SHARING: "slice-8"})
    until(lambda: labels(node).get(SHARING_STATE) == "failed", timeout=20, what="failed")
    assert "'slice-8'" in events(node, "SharingConfigFailed")[0]["message"]
    assert replicas(node) == [2] * 8


def test_a_configmap_update_of_the_sharing_folder_is_applied(node):
    start(node, "--sharing-configs", str(node.sharing))
    node.api.label_node(NODE, {SHARING: "slice-4"})
    until(lambda: replicas(node) == [4] * 8, timeout=20, what="4 replicas per GPU")
    try:
        configmap_folder(node.sharing, {"default": slicing(2), "slice-4": slicing(3)})
        until(lambda: replicas(node) == [3] * 8, timeout=20, what="the updated config")
    finally:
        configmap_folder(node.sharing, {"default": slicing(2), "slice-4": slicing(4)})


def test_a_sharing_change_that_takes_replicas_from_a_pod_waits_until_they_are_released(node):
    start(node, "--sharing-configs", str(node.sharing))
    node.api.label_node(NODE, {SHARING: "slice-4"})
    until(lambda: replicas(node) == [4] * 8, timeout=20, what="4 replicas per GPU")
    with node.agent.client() as a:
        held = a.devices(type="gpu")["gpus"][0]["replicas"][3]
        a.allocate("k8s-dra/claim-s", [held], labels={"claim": "team/slice"})
    mark = relabel(node, {SHARING: None}, SHARING_STATE)          # back to the default: 2 replicas
    waiting = until(lambda: events(node, "SharingConfigWaiting"), timeout=15, what="the waiting Event")
    assert "k8s-dra/claim-s" in waiting[0]["message"] and held.partition("::")[0] in waiting[0]["message"]
    assert labels(node)[SHARING_STATE] == "pending" and replicas(node) == [4] * 8
    with node.agent.client() as a:
        a.release("k8s-dra/claim-s")
    assert settled(node, SHARING_STATE, after=mark) == "success"
    assert replicas(node) == [2] * 8 and len(events(node, "SharingConfigWaiting")) == 1


# ---- GPU faults -------------------------------------------------------------------------------

def test_xid_79_gives_an_event_naming_it_and_the_gpu_and_the_condition_and_a_flood_is_one_event(node):
    start(node, "--taint-unhealthy")
    until(lambda: (node.api.condition(NODE, "GPUUnhealthy") or {}).get("status") == "False", timeout=15,
          what="the condition False at start")
    with node.agent.client() as a:
        gpus = a.devices(type="gpu")["gpus"]
    store = SimStore(node.root)
    control.inject_xid(store, 1, 79)
    uuid = gpus[1]["uuid"]
    event = until(lambda: events(node, "GPUUnhealthy"), timeout=10, what="the Event")[0]
    assert event["type"] == "Warning" and "XID 79" in event["message"] and uuid in event["message"]
    assert "fallen off the bus" in event["message"]
    condition = until(lambda: (node.api.condition(NODE, "GPUUnhealthy") or {}).get("status") == "True"
                      and node.api.condition(NODE, "GPUUnhealthy"), timeout=10, what="the condition True")
    assert uuid in condition["message"]
    for _ in range(30):
        control.inject_xid(store, 1, 79)
    until(lambda: events(node, "GPUUnhealthy")[0].get("count") == 31, timeout=15,
          what=lambda: f"31 counted: {events(node, 'GPUUnhealthy')}")
    assert len(events(node, "GPUUnhealthy")) == 1
    assert not node.api.get("nodes", NODE)["spec"].get("taints")        # one GPU of eight
    for gpu in range(8):
        control.inject_xid(store, gpu, 79)
    until(lambda: node.api.get("nodes", NODE)["spec"].get("taints"), timeout=10, what="the taint")
    assert node.api.get("nodes", NODE)["spec"]["taints"] == [
        {"key": "nvidia.com/gpu.unhealthy", "value": "true", "effect": "NoSchedule"}]
    with node.agent.client() as a:
        a.clear_health([uuid])
    until(lambda: not node.api.get("nodes", NODE)["spec"].get("taints"), timeout=10, what="the taint removed")
    healthy = until(lambda: events(node, "GPUHealthy"), timeout=10, what="the recovery Event")
    assert uuid in healthy[0]["message"]
    with node.agent.client() as a:
        a.clear_health()
    until(lambda: node.api.condition(NODE, "GPUUnhealthy")["status"] == "False", timeout=10, what="False again")


# ---- robustness and cost ----------------------------------------------------------------------

def test_at_rest_it_asks_the_api_server_nothing_but_its_watch(node):
    start(node, "--sharing-configs", str(node.sharing))
    node.api.label_node(NODE, {MIG: "all-1g.5gb"})
    settled(node, MIG_STATE)
    settled(node, SHARING_STATE)
    time.sleep(1)          # the last writes' echoes through the watch
    before = len(node.api.requests)
    time.sleep(20)
    asked = [r for r in node.api.requests[before:] if r[2].get("watch") != "true"]
    assert len(asked) <= 10, asked


def test_the_api_server_away_at_start_and_for_a_while_is_caught_up_with(node):
    node.api.label_node(NODE, {MIG: "all-1g.5gb"})
    node.api.stop()
    start(node)
    until(lambda: "not reachable" in node.controller_log() or "API server" in node.controller_log(),
          timeout=15, what="the controller backing off")
    node.start_api()
    until(lambda: mig_profiles(node) == ["1g.5gb"] * 56, timeout=30, what="the layout")
    until(lambda: labels(node).get(MIG_STATE) == "success", timeout=15, what="success")
    # Away again, long enough for its watch's version to be compacted away: read again.
    node.api.stop()
    node.api.label_node(NODE, {MIG: "all-disabled"})
    node.api.compact()
    node.start_api()
    assert until(lambda: labels(node).get(MIG_STATE) == "success" and mig_profiles(node) == [], timeout=60,
                 what=lambda: node.controller_log()[-2000:])


def test_with_the_agent_away_the_state_stays_until_it_is_back(node):
    start(node)
    mark = relabel(node, {MIG: "all-1g.5gb"})
    assert settled(node, MIG_STATE, after=mark) == "success"
    node.agent.stop()
    mark = relabel(node, {MIG: "all-3g.20gb"})
    time.sleep(3)
    assert labels(node)[MIG_STATE] == "success" and not events(node, "MIGConfigFailed")
    node.agent.start()
    until(lambda: mig_profiles(node) == ["3g.20gb"] * 16, timeout=30, what="the layout once the agent is back")
    assert settled(node, MIG_STATE, after=mark) == "success"


def test_a_controller_killed_in_the_middle_of_an_apply_publishes_the_outcome_after_its_restart(node):
    start(node)
    node.api.label_node(NODE, {MIG: "all-1g.5gb"})
    until(lambda: labels(node).get(MIG_STATE) == "pending", timeout=15, interval=0.005, what="pending")
    node.controller.send_signal(signal.SIGKILL)
    node.controller.wait()
    start(node)
    until(lambda: labels(node).get(MIG_STATE) == "success", timeout=30, what="success")
    assert mig_profiles(node) == ["1g.5gb"] * 56


def test_dry_run_prints_what_it_would_do_and_changes_nothing(node):
    import subprocess
    import sys
    node.api.label_node(NODE, {MIG: "all-1g.5gb", SHARING: "slice-4"})
    writes = len([r for r in node.api.requests if r[0] != "GET"])
    out = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(node.root),
                          "node-controller", "--kubeconfig", str(node.kubeconfig), "--node-name", NODE,
                          "--mig-config", str(node.files / "mig.yaml"), "--sharing-configs", str(node.sharing),
                          "--dry-run"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"{MIG_STATE}=pending and apply" in out.stdout and "slice-4" in out.stdout
    assert "GPUUnhealthy=False" in out.stdout
    assert "driver upgrade: nvidia.com/gpu-driver-upgrade-state=(none): waits (no ConfigMap asks for a driver version)" \
        in out.stdout
    assert len([r for r in node.api.requests if r[0] != "GET"]) == writes
    assert mig_profiles(node) == [] and MIG_STATE not in labels(node)
