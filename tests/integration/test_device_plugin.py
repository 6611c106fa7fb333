"""The device plugin against a test kubelet (tests/integration/kubelet.py) and the real
agent on a simulated DGX A100 (8 GPUs, NUMA nodes 0 and 1): registration, lists, health,
preferred allocations, Allocate's CDI names, MIG reconfiguration, kubelet and agent
restarts, releases, bad requests.

One agent, kubelet and plugin (``hostagent device-plugin`` as a child process, MIG strategy
mixed) for the module; each test leaves the node as it found it (MIG disabled, every device
healthy, no allocation).
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest
import yaml

from hostagent.sim.control import inject_xid
from hostagent.sim.store import SimStore
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import AgentProcess, make_root
from .kubelet import TestKubelet


GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.5gb"
GRACE = 1.0
SPLIT = {"version": "v1", "mig-configs": {
    "split": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
              {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}],
    "whole": [{"devices": "all", "mig-enabled": False}]}}


def all_healthy(n):
    return lambda devices: len(devices) == n and all(h == "Healthy" for _, h, _ in devices)


class Plugin:
    def __init__(self, root: Path, kubelet: TestKubelet, *args):
        self.log = root / "device-plugin.log"
        cmd = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "device-plugin",
               "--plugin-dir", str(kubelet.dir), "--pod-resources-socket", str(kubelet.pod_resources), *args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


class Node:
    def __init__(self):
        self.root = make_root()
        # Run by another user, the plugin is that user, named among the uids that may use the
        # kubelet plugins' allocation ids (api.plugin_uids); root may anyway.
        uids = [os.getuid()] if os.getuid() else []
        self.agent = AgentProcess(self.root, {"api": {"watch_heartbeat": 2, "plugin_uids": uids},
                                              "daemon": {"resync_interval": 0},
                                              "health": {"quiet_period": None, "wait_timeout_ms": 200}})
        self.dir = Path(tempfile.mkdtemp(prefix="dp-"))
        self.kubelet = TestKubelet(self.dir / "device-plugins", self.dir / "pod-resources/kubelet.sock")
        self.plugin = None
        self.gpus = []

    def client(self, timeout=10):
        return self.agent.client(timeout)

    def owned(self):
        with self.client() as c:
            return [a for a in c.allocations() if a["id"].startswith("k8s-device-plugin/")]

    def admit(self, pod: str, resource: str, ids: list[str]):
        """As the kubelet admits a pod: Allocate, then record the container's devices."""
        response = self.kubelet.allocate(resource, ids).container_responses[0]
        self.kubelet.pods[pod] = {"main": (resource, ids)}
        return response

    def wait_released(self, timeout=15.0):
        self.kubelet.pods.clear()
        until(lambda: not self.owned(), timeout, lambda: f"not released: {self.owned()}", interval=0.1)


@pytest.fixture(scope="module")
def node():
    n = Node()
    try:
        n.agent.start()
        n.kubelet.start()
        n.plugin = Plugin(n.root, n.kubelet, "--mig-strategy", "mixed", "--reconcile-interval", "0.3",
                          "--release-grace", str(GRACE))
        with n.client() as c:
            n.gpus = c.devices()["gpus"]
        n.kubelet.endpoint(GPU).wait(all_healthy(8))
        yield n
        assert n.plugin.stop() == 0
        assert not list(n.kubelet.dir.glob("hostagent-*.sock")), "the plugin left its sockets"
    except BaseException:
        if n.plugin is not None and n.plugin.log.exists():
            print(n.plugin.log.read_text()[-5000:])
        raise
    finally:
        if n.plugin is not None and n.plugin.proc.poll() is None:
            n.plugin.proc.kill()
        n.kubelet.stop()
        n.agent.stop()
        n.agent.cleanup()
        shutil.rmtree(n.dir, ignore_errors=True)


def uuids(node, *indices):
    return [node.gpus[i]["uuid"] for i in indices]


def test_registration_and_the_full_list_with_numa(node):
    e = node.kubelet.endpoint(GPU)
    assert e.request.version == "v1beta1" and e.request.endpoint == "hostagent-gpu.sock"
    assert e.request.options.get_preferred_allocation_available
    assert e.options.get_preferred_allocation_available and not e.options.pre_start_required
    devices = e.wait(all_healthy(8))
    assert devices == [(g["uuid"], "Healthy", [g["numa_node"]]) for g in node.gpus]
    assert [g["numa_node"] for g in node.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]     # a DGX A100 in NPS4
    assert [r.resource_name for r in node.kubelet.registrations] == [GPU]   # no MIG devices: no MIG resource


def test_allocate_answers_names_of_the_node_spec_and_records_the_allocation(node):
    ids = uuids(node, 0, 1)
    r = node.admit("pod-a", GPU, ids)
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    names = [d.name for d in r.cdi_devices]
    with node.client() as c:
        spec = yaml.safe_load(Path(c.node()["cdi"]["spec"]).read_text())
    in_spec = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    assert names == [f"{spec['kind']}={u}" for u in ids] and set(names) <= in_spec
    [alloc] = node.owned()
    assert alloc["devices"] == ids and alloc["labels"]["resource"] == GPU
    # Answered with the node spec's names, the allocation needs no spec of its own.
    assert alloc["spec_path"] is None and not list((node.root / "var/run/cdi").glob("hostagent.io-*"))
    # A kubelet retry (or an app container reusing its init container's devices): the same one.
    again = node.kubelet.allocate(GPU, list(reversed(ids))).container_responses[0]
    assert [d.name for d in again.cdi_devices] == names and [a["id"] for a in node.owned()] == [alloc["id"]]
    # The kubelet hands GPU 1 out again: it no longer holds the first set.
    node.admit("pod-b", GPU, uuids(node, 1, 2))
    del node.kubelet.pods["pod-a"]
    assert [a["devices"] for a in node.owned()] == [uuids(node, 1, 2)]
    node.wait_released()


def test_an_allocation_of_an_earlier_run_in_the_way_is_released(node):
    with node.client() as c:
        c.allocate("k8s-device-plugin/nvidia.com/gpu/earlier", ["3"],
                   labels={"owner": "hostagent-device-plugin", "resource": GPU})
    node.admit("pod-f", GPU, uuids(node, 3))
    assert [(a["id"] != "k8s-device-plugin/nvidia.com/gpu/earlier", a["devices"]) for a in node.owned()] == [
        (True, uuids(node, 3))]
    node.wait_released()


def test_allocations_no_container_holds_are_released_after_the_grace_period(node):
    """Kept through the reconciles of the grace period (the kubelet records a container's
    devices only after Allocate returns), released by the first one past it."""
    node.admit("pod-c", GPU, uuids(node, 3))
    started = time.monotonic()
    node.kubelet.allocate(GPU, uuids(node, 4))           # a container that never started
    asked = node.kubelet.listed

    def released():
        if [a["devices"] for a in node.owned()] == [uuids(node, 3)]:
            return time.monotonic() - started, node.kubelet.listed - asked
        return None
    elapsed, reconciles = until(released, GRACE + 10.0, lambda: f"not released: {node.owned()}", interval=0.05)
    assert elapsed >= GRACE, f"released {elapsed:.2f} s after its Allocate, within the {GRACE} s grace period"
    assert reconciles >= 2, "released without a reconcile passing over it first"
    node.wait_released()


def test_preferred_allocation_best_connected_then_numa_then_the_tightest_fit(node):
    node.kubelet.endpoint(GPU)
    everything = uuids(node, *range(8))
    # Every pair is NV12 through the NVSwitches; GPU pairs share a PCIe switch (PXB), and each
    # pair has its NUMA node: four GPUs are two whole pairs.
    assert sorted(node.kubelet.prefer(GPU, everything, 4)) == sorted(uuids(node, 0, 1, 2, 3))
    # Of four equal pairs, each alone on its NUMA node: the lowest node's (1: GPUs 2 and 3).
    assert node.kubelet.prefer(GPU, everything, 2) == uuids(node, 2, 3)
    # Two pairs offered whole (0-1 and 4-5) and one GPU alone: a whole pair, the first.
    assert node.kubelet.prefer(GPU, uuids(node, 6, 0, 4, 1, 5), 2) == uuids(node, 0, 1)
    # What must be included pulls the rest onto its switch and NUMA node.
    assert node.kubelet.prefer(GPU, uuids(node, 0, 1, 4, 5, 6), 2, must_include=uuids(node, 5)) == uuids(node, 5, 4)
    # Three: the pair, with the fullest NUMA node first.
    assert node.kubelet.prefer(GPU, uuids(node, 0, 4, 5), 3) == uuids(node, 4, 5, 0)
    # A device that must be included but is not offered: no set (go-gpuallocator's "Must
    # include with unavailable device"), a bad request.
    with pytest.raises(grpc.RpcError) as e:
        node.kubelet.prefer(GPU, uuids(node, 0, 1, 4), 2, must_include=uuids(node, 5))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must_include names device(s) not among the available ones" in e.value.details()


def test_bad_requests_are_grpc_errors_and_the_plugin_keeps_serving(node):
    k = node.kubelet
    k.endpoint(GPU)
    for ids, words in ((["GPU-nope"], "unknown"), ([], "none asked"), (uuids(node, 0, 0), "twice")):
        with pytest.raises(grpc.RpcError) as e:
            k.allocate(GPU, ids)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        k.prefer(GPU, uuids(node, 0, 1), 3)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as e:
        k.prefer(GPU, ["GPU-nope"], 1)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A device allocated outside Kubernetes is Unhealthy to the kubelet, and refused.
    with node.client() as c:
        c.allocate("batch-job", ["7"])
        try:
            k.endpoints[GPU].wait(lambda l: l[7][1] == "Unhealthy" and all_healthy(7)(l[:7]))
            with pytest.raises(grpc.RpcError) as e:
                k.allocate(GPU, uuids(node, 7))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "in use" in e.value.details()
        finally:
            c.release("batch-job")
    k.endpoints[GPU].wait(all_healthy(8))
    assert k.allocate(GPU, uuids(node, 7)).container_responses[0].cdi_devices
    node.wait_released()


def test_one_request_never_gives_a_gpu_to_two_containers(node):
    """Two containers of one Allocate naming the same GPU: refused whole (no container gets
    it, no allocation is made), as the kubelet never asks so."""
    k = node.kubelet
    k.endpoint(GPU)
    before = node.owned()
    with pytest.raises(grpc.RpcError) as e:
        k.allocate(GPU, uuids(node, 2), uuids(node, 3, 2))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than one container" in e.value.details()
    assert node.owned() == before
    two = k.allocate(GPU, uuids(node, 2), uuids(node, 3))        # distinct devices: each its own
    assert [list(r.cdi_devices) for r in two.container_responses] != [[], []]
    node.wait_released()


def test_a_large_bad_request_gets_a_short_error(node):
    """Thousands of unknown (or repeated) ids: INVALID_ARGUMENT naming a few, never a
    message so long the kubelet sees RESOURCE_EXHAUSTED."""
    k = node.kubelet
    k.endpoint(GPU)
    for ids, says in (([f"GPU-{i:036d}" for i in range(5000)], "and 4997 more"),
                      (uuids(node, 1) * 3000, "asked for twice: GPU-")):
        with pytest.raises(grpc.RpcError) as e:
            k.allocate(GPU, ids)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(e.value.details()) <= 400
        assert says in e.value.details()


def test_an_xid_turns_exactly_its_gpu_unhealthy(node):
    e = node.kubelet.endpoint(GPU)
    inject_xid(SimStore(node.root), 2, 79)
    try:
        devices = e.wait(lambda l: any(h == "Unhealthy" for _, h, _ in l))
        assert [i for i, h, _ in devices if h == "Unhealthy"] == uuids(node, 2)
    finally:
        with node.client() as c:
            c.clear_health(["2"])
    e.wait(all_healthy(8))


@GPU_CHANGES                    # MIG modes
def test_mig_reconfiguration_changes_the_resources(node):
    k = node.kubelet
    gpu = k.endpoint(GPU)
    before = len(k.registrations)
    with node.client(timeout=None) as c:
        c.mig_apply("split", spec=SPLIT)
        migs = [m for m in c.devices(type="mig")["mig_devices"]]
        try:
            gpu.wait(lambda l: [i for i, _, _ in l] == uuids(node, *range(1, 8)))
            mig = k.endpoint(MIG, after=before)
            assert mig.request.endpoint == "hostagent-mig-1g.5gb.sock"
            devices = mig.wait(all_healthy(7))
            assert devices == [(m["uuid"], "Healthy", [node.gpus[0]["numa_node"]]) for m in migs]
            r = node.admit("pod-mig", MIG, [migs[3]["uuid"]])
            assert [d.name for d in r.cdi_devices] == [n for n in migs[3]["cdi_devices"] if n.endswith(migs[3]["uuid"])]
            node.wait_released()            # a MIG apply may not take an allocated device away
        finally:
            c.mig_apply("whole", spec=SPLIT)
    gpu.wait(all_healthy(8))
    mig.wait(lambda l: l == [])             # capacity 0 at once, then the endpoint goes
    until(lambda: not (k.dir / "hostagent-mig-1g.5gb.sock").exists(), 10, "end of the empty resource", interval=0.1)


def test_a_restarted_kubelet_gets_every_resource_registered_again(node):
    k = node.kubelet
    before = len(k.registrations)
    k.restart()
    e = k.endpoint(GPU, after=before)
    e.wait(all_healthy(8))
    assert (k.dir / "hostagent-gpu.sock").exists()
    assert node.admit("pod-d", GPU, uuids(node, 5)).cdi_devices
    node.wait_released()


def test_refused_registration_is_retried(node):
    k = node.kubelet
    before = len(k.registrations)
    k.refuse = "busy starting"
    (k.dir / "hostagent-gpu.sock").unlink()      # the plugin serves again and registers again
    try:
        until(lambda: len(k.registrations) >= before + 2, 10, "second try")
    finally:
        k.refuse = None
    k.endpoint(GPU, after=before + 2).wait(all_healthy(8))


def test_the_agent_going_away_makes_devices_unhealthy_until_it_is_back(node):
    e = node.kubelet.endpoint(GPU)
    node.agent.stop()
    try:
        e.wait(lambda l: len(l) == 8 and all(h == "Unhealthy" for _, h, _ in l))
    finally:
        node.agent.start()
    e.wait(all_healthy(8), timeout=20)


def test_allocations_expire_without_the_pod_resources_api(node):
    """The plugin's Allocations against the module's agent, with no pod resources answer (the
    module's plugin sees the device held, and keeps out of it)."""
    from hostagent.plugins.agentlink import AgentLink
    from hostagent.plugins.allocations import Allocations
    node.kubelet.pods["pod-e"] = {"main": (GPU, uuids(node, 6))}
    link = AgentLink(node.agent.socket)
    allocations = Allocations(link, grace=0.0, expiry=0.5)
    allocations.allocate("nvidia.com/gpu", uuids(node, 6), {u: u for u in uuids(node, 6)})
    assert allocations.reconcile(None) == [] and len(node.owned()) == 1    # not idle long enough
    time.sleep(0.6)
    assert len(allocations.reconcile(None)) == 1 and node.owned() == []
    never = Allocations(link, grace=0.0, expiry=0)
    never.allocate("nvidia.com/gpu", uuids(node, 6), {u: u for u in uuids(node, 6)})
    time.sleep(0.1)
    assert never.reconcile(None) == [] and len(node.owned()) == 1
    node.wait_released()


@GPU_CHANGES                    # time-slices, MPS's exclusive-process compute mode
def test_shared_gpus_are_advertised_and_allocated_as_replicas(node):
    """Time-slicing on GPUs 6 and 7 (renamed .shared, one replica a request), MPS on GPU 5."""
    from .mpsprocs import running
    k = node.kubelet
    gpu = k.endpoint(GPU)
    before = len(k.registrations)
    config = {"version": "v1", "sharing": {
        "timeSlicing": {"renameByDefault": True, "failRequestsGreaterThanOne": True,
                        "resources": [{"name": "nvidia.com/gpu", "devices": [6, 7], "replicas": 3}]},
        "mps": {"resources": [{"name": "nvidia.com/gpu", "devices": [5], "replicas": 2}]}}}
    g5, g6, g7 = uuids(node, 5, 6, 7)
    with node.client() as c:
        c.sharing_apply(config)
        try:
            shared = k.endpoint(GPU + ".shared", after=before)
            replicas = [f"{u}::{n}" for u in (g6, g7) for n in range(3)]
            assert shared.wait(all_healthy(6)) == [(r, "Healthy", [5]) for r in replicas]   # GPUs 6, 7: NUMA 5
            listed = gpu.wait(lambda l: len(l) == 7 and all(h == "Healthy" for _, h, _ in l))
            assert [i for i, _, _ in listed] == uuids(node, 0, 1, 2, 3, 4) + [f"{g5}::0", f"{g5}::1"]
            # Replicas spread over the GPUs; two containers share GPU 6.
            assert k.prefer(GPU + ".shared", replicas, 2) == [f"{g6}::0", f"{g7}::0"]
            a = node.admit("pod-s1", GPU + ".shared", [f"{g6}::0"])
            node.admit("pod-s2", GPU + ".shared", [f"{g6}::1"])
            assert [d.name for d in a.cdi_devices] == [f"nvidia.com/gpu={g6}"] and a.envs["NVIDIA_VISIBLE_DEVICES"] == g6
            assert sorted(x["replicas"][0] for x in node.owned()) == [f"{g6}::0", f"{g6}::1"]
            with pytest.raises(grpc.RpcError) as e:
                k.allocate(GPU + ".shared", [f"{g6}::2", f"{g7}::0"])
            assert "maximum request size for shared resources is 1" in e.value.details()
            # MPS: the allocation's own spec, which gives the client its daemon's pipe.
            m = node.admit("pod-m", GPU, [f"{g5}::1"])
            [alloc] = [x for x in node.owned() if x["replicas"] == [f"{g5}::1"]]
            assert [d.name for d in m.cdi_devices] == alloc["cdi_devices"]
            spec = yaml.safe_load(Path(alloc["spec_path"]).read_text())
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in spec["devices"][0]["containerEdits"]["env"]
            node.wait_released()
        finally:
            node.kubelet.pods.clear()
            node.wait_released()
            c.sharing_apply(None)
    shared.wait(lambda l: l == [])
    gpu.wait(all_healthy(8))
    assert running(node.root) == []
