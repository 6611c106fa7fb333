"""Driver upgrades across a simulated cluster: three simulated A30 nodes (Debian 12, driver
550.90.07), each with its agent and ``hostagent node-controller``, against the test API
server. The ConfigMap ``hostagent-driver`` names the version; Lease slots admit
``maxParallelUpgrades`` nodes at a time; each node walks NVIDIA's
``nvidia.com/gpu-driver-upgrade-state``. The checks share the cluster: each starts from a
fleet at rest and names the version it wants (one the nodes do not have). Every object the
controllers write is checked against Kubernetes' schema by the test API server."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hostagent.plugins.nodecontroller import slots
from tests.waiting import until

from .fleet import NAMESPACE, STATE, Fleet, pod

A, B, C, D = "550.90.07", "550.127.05", "570.86.15", "535.216.03"      # A: the nodes' driver at creation
FAILED_MARK = "hostagent.io/driver-upgrade.failed"


@pytest.fixture(scope="module")
def fleet():
    f = Fleet()
    try:
        f.start()
        f.api.patch("nodes", "node-3", {"spec": {"unschedulable": True}})        # its admin cordoned it
        yield f
    finally:
        f.close()


@pytest.fixture
def rest(fleet):
    """The fleet at rest: every node taking part has the ConfigMap's version (a check that
    took skipped nodes back leaves them their walk to end), none walks or waits for a slot,
    every slot is free; its Pods and Events gone; what the controllers said shown when a
    check fails."""
    def at_rest():
        configmap = fleet.api.get("configmaps", "hostagent-driver", NAMESPACE) or {}
        want = (configmap.get("data") or {}).get("version")
        for name in fleet.nodes:
            node = fleet.node(name)
            state, labels = fleet.state(name), node["metadata"].get("labels") or {}
            if state in (*WALK_STATES, "upgrade-required"):
                return False
            if want and labels.get("hostagent.io/driver.upgrade") != "skip" and state != "upgrade-failed" and \
                    (state != "upgrade-done" or fleet.verified(name) != want):
                return False
        return not any(lease["spec"].get("holderIdentity") for lease in fleet.api.list("leases", NAMESPACE))
    until(at_rest, 120, lambda: f"a fleet at rest: {fleet.states()}\n{fleet.logs()}", interval=0.2)
    with fleet.api._cond:
        for kind in ("pods", "events"):
            fleet.api.objects.store[kind].clear()
        fleet.api.objects.blocked.clear()
        fleet.api.objects.evicted.clear()
    fleet.api.rejected.clear()
    yield fleet
    assert not fleet.api.rejected, fleet.api.rejected
    for name, member in fleet.nodes.items():
        assert member.controller.poll() is None, f"{name}'s controller exited:\n{fleet.logs()}"


WALK_STATES = ("cordon-required", "pod-deletion-required", "pod-restart-required", "validation-required",
               "uncordon-required")


def all_done(fleet, version: str, timeout: float = 120) -> None:
    def done():
        return all(s == "upgrade-done" for s in fleet.states().values()) and \
            all(fleet.verified(n) == version for n in fleet.nodes)
    until(done, timeout, lambda: f"not every node has {version}: {fleet.states()}\n{fleet.logs()}", interval=0.2)


def events(fleet, node: str, reason: str | None = None) -> list[str]:
    return [e["message"] for e in fleet.api.events(node) if reason is None or e["reason"] == reason]


def test_the_fleet_reaches_the_version_one_node_at_a_time(rest):
    fleet = rest
    api = fleet.api
    for p in (pod("team", "train-1", "node-1", gpus=1), pod("team", "train-2", "node-2", gpus=2),
              pod("team", "web", "node-2"), pod("monitoring", "dcgm-exporter-x1", "node-1", gpus=1, daemonset=True)):
        api.create(p)
    api.objects.blocked[("team", "train-2")] = 2           # its disruption budget refuses twice
    since = fleet.revision()
    assert fleet.states() == {"node-1": "", "node-2": "", "node-3": ""}
    fleet.configmap(version=B, maxParallelUpgrades=1)

    all_done(fleet, B)
    assert fleet.most_walking(since) == 1
    for name in fleet.nodes:
        walk = [(state, cordoned) for _, n, state, cordoned in fleet.history(since) if n == name]
        during = [cordoned for state, cordoned in walk if state in WALK_STATES[1:-1]]
        assert during and all(during), (name, walk)          # cordoned from pod deletion to validation
        assert fleet.installs(name, B) == 1
        # Each step's Event follows its label (the last node's last one may still be on its way).
        said = until(lambda: (lambda said: said if "upgrade-done: " in said else None)(
            " | ".join(events(fleet, name, "GPUDriverUpgrade"))), 10, f"{name}'s upgrade-done Event")
        for state in ("upgrade-required", *WALK_STATES, "upgrade-done"):
            assert f"{state}: " in said, (name, state, said)
    assert not fleet.cordoned("node-1") and not fleet.cordoned("node-2")
    assert fleet.cordoned("node-3")                           # its admin's cordon stays
    assert "stays cordoned" in " ".join(events(fleet, "node-3", "GPUDriverUpgrade"))
    assert sorted(api.objects.evicted) == [("team", "train-1"), ("team", "train-2")]
    assert api.objects.blocked[("team", "train-2")] == 0     # evicted after its two 429s
    assert [r for r in api.requests if r[0] == "POST" and r[1].endswith("/train-2/eviction")].__len__() == 3
    assert api.get("pods", "web", "team") and api.get("pods", "dcgm-exporter-x1", "monitoring")
    assert "evicted team/train-2" in " ".join(events(fleet, "node-2", "GPUDriverUpgrade"))
    leases = api.list("leases", NAMESPACE)
    assert [l["metadata"]["name"] for l in leases] == ["hostagent-driver-upgrade-0"]
    assert not leases[0]["spec"].get("holderIdentity")         # released at the end


def test_a_version_no_repository_offers_fails_the_first_node_and_the_others_do_not_start(rest):
    fleet = rest
    since = fleet.revision()
    before = {name: fleet.verified(name) for name in fleet.nodes}
    assert len(set(before.values())) == 1
    fleet.configmap(version="999.1.1", maxParallelUpgrades=1)
    failed = until(lambda: next((n for n, s in fleet.states().items() if s == "upgrade-failed"), None), 60,
                   lambda: f"no node failed: {fleet.states()}\n{fleet.logs()}", interval=0.2)
    others = [n for n in fleet.nodes if n != failed]
    # Each of the others saw the failure and waits: a Warning says why, and none started.
    for name in others:
        halted = until(lambda: events(fleet, name, "GPUDriverUpgradeHalted"), 30,
                       lambda: f"{name} does not say it is halted: {fleet.states()}\n{fleet.logs()}")
        assert halted == [f"{failed} failed to upgrade to 999.1.1: the driver 999.1.1 was not installed: no repository "
                          "offers nvidia-driver 999.1.1 " + halted[0].split("nvidia-driver 999.1.1 ", 1)[1]]
        assert fleet.state(name) == "upgrade-required"
        assert not any(state in WALK_STATES for _, n, state, _ in fleet.history(since) if n == name)
    why = events(fleet, failed, "GPUDriverUpgradeFailed")
    assert len(why) == 1 and why[0].startswith("the upgrade to the driver 999.1.1 failed at pod-restart-required: the "
                                               "driver 999.1.1 was not installed: no repository offers nvidia-driver "
                                               "999.1.1 (offered: ")
    assert why[0].endswith("; the node stays cordoned") and fleet.cordoned(failed)
    assert fleet.verified(failed) == before[failed]           # nothing changed on it
    assert [m["node"] for m in fleet.lease_marks().values()] == [failed]
    writes = len([r for r in fleet.api.requests if r[0] != "GET"])
    dry = fleet.dry_run(others[0])
    assert dry.returncode == 0 and ("driver upgrade: nvidia.com/gpu-driver-upgrade-state=upgrade-required: waits (the "
                                    f"rollout is halted: {failed} failed to upgrade to 999.1.1: ") in dry.stdout, dry
    assert len([r for r in fleet.api.requests if r[0] != "GET"]) == writes

    # The admin goes back to the version the nodes have: the failed node is done again (its
    # own cordon lifted, its mark gone), and so are the others.
    fleet.configmap(version=before[failed])
    all_done(fleet, before[failed])
    assert fleet.lease_marks() == {}
    assert fleet.cordoned(failed) == (failed == "node-3")     # only node-3's admin cordon stays
    assert all(fleet.installs(n, "999.1.1") == (1 if n == failed else 0) for n in fleet.nodes)


def test_the_configmap_changed_mid_rollout_is_followed(rest):
    fleet = rest
    fleet.configmap(version=C, maxParallelUpgrades=1)
    first = until(lambda: next((n for n, s in fleet.states().items() if s in WALK_STATES[1:]), None), 60,
                  lambda: f"no node started: {fleet.states()}\n{fleet.logs()}", interval=0.05)
    since = fleet.revision()
    fleet.configmap(version=D, maxParallelUpgrades=2)
    all_done(fleet, D)
    assert fleet.most_walking(since) == 2                      # two slots now, and both were used
    walked = {n for _, n, s, _ in fleet.history(since) if s == "cordon-required"}
    assert first not in walked and walked == set(fleet.nodes) - {first}   # the first went on without a new start
    assert all(fleet.installs(n, C) == 0 for n in walked)
    said = " ".join(events(fleet, first, "GPUDriverUpgrade"))
    assert f"the fleet's version is now {D}" in said


def test_a_controller_killed_mid_upgrade_resumes_and_skipped_nodes_stay(rest):
    """node-2's installer stops itself before its verify step (a fault point); its
    controller is killed and its agent restarted meanwhile. Both carry on from where they
    were: the same slot, the same install, once."""
    fleet = rest
    skipped = {name: fleet.verified(name) for name in ("node-1", "node-3")}
    labels = {name: fleet.state(name) for name in skipped}
    for name in skipped:
        fleet.api.label_node(name, {"hostagent.io/driver.upgrade": "skip"})
    member = fleet.nodes["node-2"]
    installs = fleet.installs("node-2", C)          # the agent's log holds the earlier checks' too
    member.agent.env = {"HOSTAGENT_FAULT": "driver:before_verify=stop"}
    member.agent.stop()
    member.agent.start()
    try:
        fleet.configmap(version=C, maxParallelUpgrades=1)
        with member.agent.client() as c:
            held = until(lambda: (lambda v: v if (v["progress"] or "").startswith("verify:") else None)(
                c.driver_install()), 60, lambda: f"no install held:\n{fleet.logs()}", interval=0.1)
        lease = fleet.api.get("leases", "hostagent-driver-upgrade-0", NAMESPACE)
        fleet.kill_controller("node-2")
        member.agent.env = {}
        member.agent.kill()
        member.agent.start()
        assert fleet.state("node-2") == "pod-restart-required"
        fleet.start_controller("node-2")
        os.kill(held["process"]["pid"], signal.SIGCONT)
        until(lambda: fleet.state("node-2") == "upgrade-done" and fleet.verified("node-2") == C, 60,
              lambda: f"node-2 did not finish: {fleet.states()}\n{fleet.logs()}", interval=0.2)
        assert fleet.installs("node-2", C) == installs + 1
        after = fleet.api.get("leases", "hostagent-driver-upgrade-0", NAMESPACE)
        assert after["spec"].get("leaseTransitions") == lease["spec"].get("leaseTransitions")   # the same hold
        assert not fleet.cordoned("node-2")
        assert {name: fleet.verified(name) for name in skipped} == skipped != {"node-1": C, "node-3": C}
        assert {name: fleet.state(name) for name in skipped} == labels
    finally:
        for name in ("node-1", "node-3"):
            fleet.api.label_node(name, {"hostagent.io/driver.upgrade": None})
        member.agent.env = {}


def test_a_walk_that_failed_before_its_slot_went_halts_the_rollout_once_restarted(rest):
    """node-1's upgrade failed and its controller stopped before it released the slot (the
    last write of a failure; the API server may refuse it too). Restarted, it releases the
    slot with the mark that halts the others, which waited for that slot and do not start."""
    fleet = rest
    api, slot, bad = fleet.api, slots.slot_name(0), "999.1.1"
    installed = fleet.verified("node-1")
    installs = {name: fleet.installs(name, bad) for name in fleet.nodes}
    fleet.kill_controller("node-1")
    try:
        api.patch("nodes", "node-1", {"metadata": {"labels": {STATE: "upgrade-failed"},
                                                   "annotations": {"hostagent.io/driver-upgrade.version": bad}}})
        now = slots.micro_time(time.time())
        held = {"holderIdentity": "node-1", "leaseDurationSeconds": 60, "acquireTime": now, "renewTime": now}
        if api.get("leases", slot, NAMESPACE) is None:
            api.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": slot, "namespace": NAMESPACE, "labels": slots.LABELS}, "spec": held})
        else:
            api.patch("leases", slot, {"spec": held}, NAMESPACE)
        since = fleet.revision()
        fleet.configmap(version=bad, maxParallelUpgrades=1)
        until(lambda: fleet.state("node-2") == fleet.state("node-3") == "upgrade-required", 30,
              lambda: f"the others do not wait for the slot: {fleet.states()}\n{fleet.logs()}")
        fleet.start_controller("node-1")
        until(lambda: not (api.get("leases", slot, NAMESPACE)["spec"].get("holderIdentity")), 30,
              lambda: f"node-1 keeps its slot: {fleet.states()}\n{fleet.logs()}")
        assert [(m["node"], m["version"]) for m in fleet.lease_marks().values()] == [("node-1", bad)]
        for name in ("node-2", "node-3"):
            until(lambda: events(fleet, name, "GPUDriverUpgradeHalted"), 30,
                  lambda: f"{name} does not say it is halted: {fleet.states()}\n{fleet.logs()}")
            assert fleet.state(name) == "upgrade-required"
            assert not any(state in WALK_STATES for _, n, state, _ in fleet.history(since) if n == name)
            assert fleet.installs(name, bad) == installs[name]
    finally:
        if fleet.nodes["node-1"].controller.poll() is not None:
            fleet.start_controller("node-1")
    fleet.configmap(version=installed)
    all_done(fleet, installed)
    assert fleet.lease_marks() == {}


def test_a_failed_node_its_admin_uncordoned_then_cordoned_again_stays_cordoned(rest):
    """The docs' way out of a failure: the admin uncordons the node by hand. Its controller
    forgets the cordon it had recorded, so the admin's own cordon made later (maintenance)
    is not taken for the upgrade's and lifted when the node is fixed."""
    fleet = rest
    installed = fleet.verified("node-1")
    for name in ("node-2", "node-3"):
        fleet.api.label_node(name, {"hostagent.io/driver.upgrade": "skip"})
    try:
        fleet.configmap(version="999.1.1", maxParallelUpgrades=1)
        until(lambda: fleet.state("node-1") == "upgrade-failed", 60,
              lambda: f"node-1 did not fail: {fleet.states()}\n{fleet.logs()}", interval=0.2)
        assert fleet.cordoned("node-1")
        fleet.api.patch("nodes", "node-1", {"spec": {"unschedulable": None}})              # kubectl uncordon
        until(lambda: "hostagent.io/cordoned-by" not in (fleet.node("node-1")["metadata"].get("annotations") or {}),
              15, lambda: f"the lifted cordon is not forgotten:\n{fleet.logs()}")
        fleet.api.patch("nodes", "node-1", {"spec": {"unschedulable": True}})              # kubectl cordon
        fleet.configmap(version=installed)                   # fixed: the version it has
        until(lambda: fleet.state("node-1") == "upgrade-done", 60,
              lambda: f"node-1 is not done: {fleet.states()}\n{fleet.logs()}", interval=0.2)
        assert fleet.cordoned("node-1")
        assert "stays cordoned (not by the upgrade)" in events(fleet, "node-1", "GPUDriverUpgrade")[-1]
    finally:
        fleet.api.patch("nodes", "node-1", {"spec": {"unschedulable": None}})
        for name in ("node-2", "node-3"):
            fleet.api.label_node(name, {"hostagent.io/driver.upgrade": None})
    all_done(fleet, installed)


def test_a_controller_stopped_or_killed_mid_eviction_goes_on_with_the_time_left(rest):
    """node-1's GPU pod is never let go by its budget (podDeletionTimeoutSeconds 12). Its
    controller is stopped (SIGTERM) as it evicts: no failure, the walk waits at its step.
    Started again, then killed 7 s in, and started once the 12 s are over: the timeout
    counts from when the evictions began, so the upgrade fails at once. With another
    version and podDeletionForce, the pod is deleted and the node upgraded."""
    fleet = rest
    api, member = fleet.api, fleet.nodes["node-1"]
    installed = fleet.verified("node-1")
    version = next(v for v in (B, C, D) if v != installed)
    for name in ("node-2", "node-3"):
        api.label_node(name, {"hostagent.io/driver.upgrade": "skip"})
    api.create(pod("team", "train-1", "node-1", gpus=1))
    api.objects.blocked[("team", "train-1")] = None
    before = evictions(api)
    try:
        fleet.configmap(version=version, maxParallelUpgrades=1, podDeletionTimeoutSeconds=12)
        until(lambda: evictions(api) > before, 60, lambda: f"no eviction: {fleet.states()}\n{fleet.logs()}",
              interval=0.01)
        began = time.time()
        member.controller.send_signal(signal.SIGTERM)
        assert member.controller.wait(15) == 0
        assert fleet.state("node-1") == "pod-deletion-required" and not events(fleet, "node-1", "GPUDriverUpgradeFailed")
        fleet.start_controller("node-1")
        until(lambda: time.time() >= began + 7, 15, "7 s of evictions")
        assert fleet.state("node-1") == "pod-deletion-required"
        fleet.kill_controller("node-1")
        until(lambda: time.time() >= began + 12.5, 15, "the timeout over")
        refused = evictions(api)
        fleet.start_controller("node-1")
        until(lambda: fleet.state("node-1") == "upgrade-failed", 15,
              lambda: f"node-1 did not fail: {fleet.states()}\n{fleet.logs()}", interval=0.1)
        [why] = events(fleet, "node-1", "GPUDriverUpgradeFailed")
        assert "GPU pods were not evicted within 12 s" in why and "(podDeletionForce is false)" in why
        assert evictions(api) <= refused + 1                  # one last try at most, not a new timeout's worth
        assert api.get("pods", "train-1", "team") and fleet.cordoned("node-1")

        # Its admin lets pods be deleted, with another version (in the same change: the node
        # waits for its admin until the ConfigMap names a version it did not fail).
        version = next(v for v in (B, C, D) if v not in (installed, version))
        fleet.configmap(version=version, podDeletionTimeoutSeconds=1, podDeletionForce="true")
        until(lambda: fleet.state("node-1") == "upgrade-done" and fleet.verified("node-1") == version, 60,
              lambda: f"node-1 is not upgraded: {fleet.states()}\n{fleet.logs()}", interval=0.2)
        assert api.get("pods", "train-1", "team") is None and ("team", "train-1") not in api.objects.evicted
        assert "deleted team/train-1 (podDeletionForce)" in " ".join(events(fleet, "node-1", "GPUDriverUpgrade"))
        assert not fleet.cordoned("node-1")
        assert "hostagent.io/driver-upgrade.eviction-started" not in fleet.node("node-1")["metadata"]["annotations"]
    finally:
        if member.controller.poll() is not None:
            fleet.start_controller("node-1")
        for name in ("node-2", "node-3"):
            api.label_node(name, {"hostagent.io/driver.upgrade": None})
        fleet.configmap(podDeletionTimeoutSeconds=None, podDeletionForce=None)
    all_done(fleet, version)


def evictions(api) -> int:
    return sum(1 for method, url, _ in api.requests if method == "POST" and url.endswith("/eviction"))


def authorized(rules: list[tuple[str, dict]], verb: str, group: str, resource: str, namespace: str | None,
               name: str | None) -> bool:
    """Whether RBAC ``rules`` ((the Role's namespace or None for a ClusterRole, rule)) allow it."""
    for scope, rule in rules:
        if scope is not None and scope != namespace:
            continue
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] and \
                (not rule.get("resourceNames") or name in rule["resourceNames"]):
            return True
    return False


def test_every_request_the_controllers_made_is_one_their_rbac_allows(fleet):
    """The requests of every check above, each as the API server's authorizer sees it
    (a list or watch naming one object by metadata.name is a request for that name)."""
    import re
    from pathlib import Path
    from urllib.parse import unquote

    import yaml
    base = Path(__file__).resolve().parents[2] / "packaging/kubernetes/base"
    # The checks above set podDeletionForce: "true", with the RBAC the docs say to apply for it.
    manifests = (base / "node-controller-rbac.yaml", base / "node-controller-force-rbac.yaml")
    rules = [(doc["metadata"].get("namespace") if doc["kind"] == "Role" else None, rule)
             for manifest in manifests
             for doc in yaml.safe_load_all(manifest.read_text()) if doc["kind"] in ("Role", "ClusterRole")
             for rule in doc["rules"]]
    path = re.compile(r"^/(?:api/v1|apis/([^/]+)/[^/]+)(?:/namespaces/([^/]+))?/([a-z]+)(?:/([^/]+))?(?:/([a-z]+))?$")
    seen = set()
    for method, url, query in fleet.api.requests:
        group, namespace, resource, name, sub = path.match(url).groups()
        group = group or ""
        if sub:
            resource = f"{resource}/{sub}"
        selector = unquote(query.get("fieldSelector", ""))
        if name is None and selector.startswith("metadata.name="):
            name = selector.split("=", 1)[1]
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method) or (
            "watch" if query.get("watch") in ("true", "1") else "get" if url.rsplit("/", 1)[-1] == name else "list")
        assert authorized(rules, verb, group, resource, namespace, name), (method, url, query)
        seen.add((verb, resource))
    assert {("watch", "configmaps"), ("list", "leases"), ("watch", "leases"), ("create", "leases"),
            ("update", "leases"), ("create", "pods/eviction"), ("list", "pods"), ("patch", "nodes"),
            ("delete", "pods")} <= seen
