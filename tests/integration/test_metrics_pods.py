"""Pod attribution on the metrics page: a test kubelet pod resources server says which pod
holds each GPU, MIG device, shared replica and DRA claim device, and their series gain
``pod``, ``namespace`` and ``container`` (and a claim's ``dra_*``) labels. A kubelet that is
missing or slow never delays a scrape or drops a series."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostagent.devices import read_inventory
from hostagent.metrics import MetricsOptions, MetricsService
from hostagent.metrics.pods import uuid_resolver
from hostagent.plugins.kubelet import podresources_pb2 as pr
from hostagent.plugins.kubelet import podresources_pb2_grpc as pr_grpc
from hostagent.sim.node import MIG_ENABLE

from tests.waiting import until

from .agentd import make_root, running_agent

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


class PodResources(pr_grpc.PodResourcesListerServicer):
    """Answers List with ``pods``: (pod, namespace, container, device ids, claims), a claim
    being (name, namespace, driver, pool, device, CDI names); ``delay`` seconds late."""

    def __init__(self, path):
        self.pods, self.delay, self.asked = [], 0.0, threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()

    def List(self, request, context):
        self.asked.set()
        time.sleep(self.delay)
        reply = pr.ListPodResourcesResponse()
        for pod, ns, container, ids, claims in self.pods:
            c = reply.pod_resources.add(name=pod, namespace=ns).containers.add(name=container)
            if ids:
                c.devices.add(resource_name="nvidia.com/gpu", device_ids=ids)
            for name, claim_ns, driver, pool, device, cdi in claims:
                r = c.dynamic_resources.add(claim_name=name, claim_namespace=claim_ns)
                cr = r.claim_resources.add(driver_name=driver, pool_name=pool, device_name=device)
                for n in cdi:
                    cr.cdi_devices.add(name=n)
        return reply


def parse(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def labels_of(fams, name, **match):
    return [s.labels for s in fams[name].samples if all(s.labels.get(k) == v for k, v in match.items())]


@pytest.fixture
def node(make_node):
    made = []

    def make(profile="hgx-h100", layout=None, server=True, **kw):
        host, store = make_node(profile)
        if layout:
            layout(store)
        kubelet = PodResources(host.host(SOCKET)) if server else None
        svc = MetricsService(host, read_inventory(host),
                             MetricsOptions(port=None, interval=kw.pop("interval", 3600), kubernetes=True), **kw)
        made.append((svc, kubelet))
        return host, svc, kubelet
    yield make
    for svc, kubelet in made:
        svc.stop()
        if kubelet:
            kubelet.server.stop(0).wait()


def test_device_plugin_ids_label_their_gpus_and_instances(node):
    def one_mig(store):
        with store.mutate() as s:
            s.set_mig_mode(store.facts, 0, MIG_ENABLE)
            s.reset_gpu(0)
            gi = s.create_gi(store.facts, 0, 19)
            s.create_ci(store.facts, 0, gi.id, 0)
    host, svc, kubelet = node(layout=one_mig)
    inv = read_inventory(host)
    g1, g2, mig = inv.gpus[1].uuid, inv.gpus[2].uuid, inv.mig_devices[0]
    kubelet.pods = [("train-0", "ml", "trainer", [g1], []),
                    ("infer-a", "web", "server", [f"{g2}::0"], []),          # shared replicas
                    ("infer-b", "ml", "server", [f"{g2}::3"], []),
                    ("small", "ml", "job", [mig.uuid], []),
                    ("nic", "net", "dpdk", ["0000:3b:00.1", "0"], [])]       # not GPUs: ignored
    svc.start()
    svc.pods.refresh()
    fams = parse(svc.render().decode())
    (s,) = labels_of(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="1")
    assert (s["pod"], s["namespace"], s["container"]) == ("train-0", "ml", "trainer")
    (s,) = labels_of(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="2")
    assert (s["pod"], s["namespace"], s["container"]) == ("infer-a,infer-b", "web,ml", "server")
    (s,) = labels_of(fams, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID=str(mig.gi))   # the MIG device's instance
    assert (s["pod"], s["container"]) == ("small", "job")
    assert "pod" not in labels_of(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="0")[0]       # its GPU: nobody's
    assert "pod" not in labels_of(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="3")[0]
    assert kubernetes_success(svc) == [1]
    kubelet.pods = []                                   # the pods end: their labels go
    svc.pods.refresh()
    assert "pod" not in labels_of(parse(svc.render().decode()), "DCGM_FI_DEV_GPU_TEMP", gpu="1")[0]


def test_dra_claims_by_their_cdi_devices(node):
    names = {}
    host, svc, kubelet = node(profile="dgx-a100", pod_resolver=lambda: uuid_resolver(names))
    inv = read_inventory(host)
    names["hostagent.io/allocation=claim-uid-1-gpu4"] = (inv.gpus[4].uuid,)
    kubelet.pods = [("llm", "team-a", "main", [],
                     [("gpu-claim", "team-a", "gpu.nvidia.com", "node-1", "gpu-4",
                       ["hostagent.io/allocation=claim-uid-1-gpu4"]),
                      ("other", "team-a", "gpu.nvidia.com", "node-1", "gpu-9", ["vendor.com/x=unknown"])])]
    svc.start()
    svc.pods.refresh()
    (s,) = labels_of(parse(svc.render().decode()), "DCGM_FI_DEV_POWER_USAGE", gpu="4")
    assert {k: s[k] for k in ("pod", "namespace", "container", "dra_claim_name", "dra_claim_namespace",
                              "dra_driver_name", "dra_pool_name", "dra_device_name")} == {
        "pod": "llm", "namespace": "team-a", "container": "main", "dra_claim_name": "gpu-claim",
        "dra_claim_namespace": "team-a", "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": "node-1",
        "dra_device_name": "gpu-4"}
    assert not any("dra_device_name" in s.labels and s.labels["dra_device_name"] == "gpu-9"
                   for f in parse(svc.render().decode()).values() for s in f.samples)


def kubernetes_success(svc):
    fams = parse(svc.render().decode())
    return [s.value for s in fams["hostagent_scrape_collector_success"].samples
            if s.labels["collector"] == "kubernetes"]


def test_a_missing_kubelet_socket_leaves_the_labels_out(node):
    host, svc, _ = node(server=False)
    svc.start()
    svc.pods.refresh()
    fams = parse(svc.render().decode())
    assert len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 8 and not any("pod" in s.labels
                                                                       for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples)
    assert kubernetes_success(svc) == [0]
    assert "no kubelet pod resources socket" in svc.pods.reason


def test_a_slow_kubelet_never_delays_a_scrape(node):
    host, svc, kubelet = node(interval=1)               # List may take up to an interval
    kubelet.pods = [("late", "ml", "c", [read_inventory(host).gpus[0].uuid], [])]
    kubelet.delay = 3.0
    svc.start()
    assert kubelet.asked.wait(5)
    t0 = time.perf_counter()
    fams = parse(svc.render().decode())                 # while the kubelet has not answered
    assert time.perf_counter() - t0 < 0.5
    assert len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 8
    until(lambda: svc.pods.ok is not None, 5, "answer from the pod collector")
    assert svc.pods.ok is False and "did not answer" in svc.pods.reason
    assert kubernetes_success(svc) == [0]
    assert not any("pod" in s.labels for s in parse(svc.render().decode())["DCGM_FI_DEV_GPU_TEMP"].samples)


def test_the_daemon_attributes_its_allocations():
    """Through the real daemon: a claim whose CDI device is an allocation's gets that
    device's series labelled, beside its allocation label."""
    with running_agent(make_root("dgx-a100"), {"metrics": {"interval": 1, "kubernetes": True}},
                       start=False) as agent:
        kubelet = PodResources(agent.host.host(SOCKET))
        try:
            agent.start()
            with agent.client() as c:
                alloc = c.allocate("claim-uid-7", ["5"])
                gpu5 = alloc["devices"][0]
                kubelet.pods = [("llm", "team-b", "main", [], [("big", "team-b", "gpu.nvidia.com", "node", "gpu-5",
                                                                 alloc["cdi_devices"])])]

                def labelled():
                    fams = parse(c.metrics())
                    (s,) = labels_of(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="5")
                    return "pod" in s and (fams, s)
                fams, s = until(labelled, 10, "pod label on GPU 5's series", interval=0.2)
            assert (s["UUID"], s["pod"], s["dra_claim_name"], s["allocation"]) == (gpu5, "llm", "big", "claim-uid-7")
            assert [x.value for x in fams["hostagent_scrape_collector_success"].samples
                    if x.labels["collector"] == "kubernetes"] == [1]
        finally:
            kubelet.server.stop(0).wait()


def test_a_kubelet_socket_that_accepts_and_never_answers_stops_nothing():
    """Through the real daemon: the pod resources socket accepts connections and never says
    a byte (a kubelet hung mid-start). Scrapes answer, the agent's loop answers and
    allocates, and collector="kubernetes" reads 0."""
    import socket
    with running_agent(make_root("dgx-a100"), {"metrics": {"interval": 1, "kubernetes": True}},
                       start=False) as agent:
        path = agent.host.host(SOCKET)
        path.parent.mkdir(parents=True, exist_ok=True)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        listener.listen(16)
        held = []
        stop = threading.Event()

        def accept():
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])          # kept open, never read, never written
                except OSError:
                    continue
        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            agent.start()
            until(lambda: held, 15, "the daemon connecting to the pod resources socket")
            with agent.client(timeout=5) as c:
                until(lambda: [s.value for s in parse(c.metrics())["hostagent_scrape_collector_success"].samples
                               if s.labels["collector"] == "kubernetes"] == [0], 20,
                      "collector kubernetes at 0", interval=0.2)
                for _ in range(3):
                    fams = parse(c.metrics())
                    assert len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 8
                    assert not any("pod" in s.labels for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples)
                c.allocate("while-hung", ["0"])
                c.node()
                c.release("while-hung")
                assert c.live()["live"] is True
        finally:
            stop.set()
            acceptor.join(5)
            for conn in held:
                conn.close()
            listener.close()
