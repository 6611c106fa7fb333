"""Device taints for unhealthy devices, checked from outside: the agent and ``hostagent
dra-plugin`` on a simulated DGX A100, the test API server (every slice written checked
with kubernetes-validate and the validation limits of its version) and the test scheduler,
which passes over a device with a NoSchedule taint the claim does not tolerate.

NVIDIA's keys, values and effects; gone when the agent's health recovers, the ``timeAdded``
of those that stay kept; beside ``--dynamic-mig``'s slices; NoExecute only with
``--taint-no-execute``; left out, said once in the log, where the API server drops them.
"""

import pytest

from hostagent.sim import faults
from hostagent.sim.control import inject_xid
from hostagent.sim.store import SimStore

from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .dracluster import AGENT, DRIVER, NODE, Cluster, quickstart, running
from .drasched import Unschedulable

pytest.importorskip("celpy", reason="cel-python is in the [test] extra")

XID, LOST, UNMONITORED = "gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/unmonitored"
DEMOS = quickstart()


def started(version, *, taints=None, plugin_args=(), agent=None):
    """A cluster of ``version`` (``taints``: its DRADeviceTaints gate, else the version's
    default) running for the block, its GPUs in ``gpus``."""
    c = Cluster(version=version, plugin_args=plugin_args, agent_config=agent)
    if taints is not None:
        c.api.device_taints = taints

    def ready(c):
        c.devices()
        with c.agent.client() as client:
            c.gpus = client.devices()["gpus"]
    return running(c, ready)


def taints(cluster) -> dict[str, list[tuple]]:
    """Each published device's taints, as (key, value, effect)."""
    return {name: [(t["key"], t.get("value"), t["effect"]) for t in d.get("taints") or ()]
            for name, d in cluster.devices().items()}


def tainted(cluster) -> dict[str, list[tuple]]:
    return {name: t for name, t in taints(cluster).items() if t}


def times(cluster) -> dict[tuple, str]:
    return {(name, t["key"]): t["timeAdded"] for name, d in cluster.devices().items() for t in d.get("taints") or ()}


def name(cluster, index: int) -> str:
    return f"gpu-{cluster.gpus[index]['minor']}"


def restart_plugin(cluster, args) -> None:
    number = cluster.kubelet.plugin().number
    assert cluster.stop_plugin() == 0
    cluster.plugin_args = args
    cluster.start_plugin()
    cluster.kubelet.plugin(after=number + 1)


def claim_at(cluster, index: int, tolerations=None) -> dict:
    """A gpu.nvidia.com claim for exactly GPU ``index``."""
    return cluster.claim_at(cluster.gpus[index]["pci_bus_id"].lower()[4:], tolerations)


def many(cluster, count: int) -> dict:
    cluster._claims += 1
    return cluster.api.put_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                  "metadata": {"namespace": "default", "name": f"many-{cluster._claims}"},
                                  "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                                      "deviceClassName": "gpu.nvidia.com", "count": count}}]}}})


@pytest.fixture(scope="module")
def cluster():
    with started((1, 36)) as c:        # DRADeviceTaints beta: on by default
        yield c


@pytest.fixture(autouse=True)
def clean(request):
    yield
    if "cluster" in request.fixturenames:
        c = request.getfixturevalue("cluster")
        with c.agent.client() as client:
            client.clear_health()
        until(lambda: not tainted(c), what="no taint left")
        assert not c.api.rejected, c.api.rejected


def test_an_xid_taints_its_gpu_the_scheduler_passes_it_over_and_recovery_takes_the_taint_away(cluster):
    store = SimStore(cluster.root)
    inject_xid(store, 1, 48)
    bad = name(cluster, 1)
    until(lambda: tainted(cluster) == {bad: [(XID, "48", "NoSchedule")]}, what=lambda: f"taints {tainted(cluster)}")
    first = times(cluster)[(bad, XID)]
    # Eight GPUs, one tainted: seven are given, never that one; eight are not; a claim
    # naming it is refused unless it tolerates the taint.
    with pytest.raises(Unschedulable):
        cluster.scheduler.allocate(many(cluster, 8), NODE)
    seven = cluster.scheduler.allocate(many(cluster, 7), NODE)
    assert bad not in {r["device"] for r in seven["status"]["allocation"]["devices"]["results"]}
    cluster.scheduler.deallocate(seven)
    with pytest.raises(Unschedulable):
        cluster.scheduler.allocate(claim_at(cluster, 1), NODE)
    tolerating = cluster.scheduler.allocate(
        claim_at(cluster, 1, [{"key": XID, "operator": "Exists", "effect": "NoSchedule"}]), NODE)
    [result] = tolerating["status"]["allocation"]["devices"]["results"]
    assert result["device"] == bad and result["tolerations"][0]["key"] == XID
    cluster.scheduler.deallocate(tolerating)
    # An XID the agent's policy ignores: an informational taint (None), which blocks nothing;
    # the slice written again keeps the first taint's time.
    generation = cluster.api.pool(DRIVER, NODE)[0]["spec"]["pool"]["generation"]
    inject_xid(store, 2, 13)
    other = name(cluster, 2)
    until(lambda: tainted(cluster) == {bad: [(XID, "48", "NoSchedule")], other: [(XID, "13", "None")]},
          what=lambda: f"taints {tainted(cluster)}")
    assert cluster.api.pool(DRIVER, NODE)[0]["spec"]["pool"]["generation"] > generation
    assert times(cluster)[(bad, XID)] == first
    cluster.scheduler.deallocate(cluster.scheduler.allocate(claim_at(cluster, 2), NODE))
    # Recovered (the agent's health cleared for GPU 1): its taint goes, the other keeps its time.
    noted = times(cluster)[(other, XID)]
    with cluster.agent.client() as c:
        c.clear_health(["1"])
    until(lambda: tainted(cluster) == {other: [(XID, "13", "None")]}, what=lambda: f"taints {tainted(cluster)}")
    assert times(cluster)[(other, XID)] == noted
    cluster.scheduler.deallocate(cluster.scheduler.allocate(claim_at(cluster, 1), NODE))


def test_a_lost_gpu_stays_published_tainted_and_no_execute_is_opt_in(cluster):
    store = SimStore(cluster.root)
    inject_xid(store, 3, 79)
    until(lambda: tainted(cluster) == {name(cluster, 3): [(XID, "79", "NoSchedule")]},
          what=lambda: f"taints {tainted(cluster)}")
    restart_plugin(cluster, ["--taint-no-execute"])
    try:
        until(lambda: tainted(cluster) == {name(cluster, 3): [(XID, "79", "NoExecute")]},
              what=lambda: f"taints {tainted(cluster)}")
        # GPU 4 falls off the bus: NVML says it is lost, and the agent's next read leaves it
        # out of its inventory; its device stays in the pool, tainted.
        lost = name(cluster, 4)
        faults.inject(store, "gpu-lost", gpu=4)
        until(lambda: (LOST, None, "NoExecute") in tainted(cluster).get(lost, ()),
              what=lambda: f"taints {tainted(cluster)}")
        with cluster.agent.client() as c:
            c.refresh()
            assert len(c.devices()["gpus"]) == 7
        assert (LOST, None, "NoExecute") in taints(cluster)[lost]
        # Reset (it answers again) and cleared: watched again, no taint left.
        faults.clear(store, "gpu-lost", gpu=4)
        with cluster.agent.client() as c:
            c.refresh()
            c.clear_health()
        until(lambda: not tainted(cluster), timeout=20, what=lambda: f"taints {tainted(cluster)}")
        assert lost in cluster.devices()
    finally:
        restart_plugin(cluster, [])


def test_a_quiet_period_recovers_and_1_35_takes_the_none_effect():
    quiet = {**AGENT, "health": {"quiet_period": 5, "wait_timeout_ms": 200}}
    with started((1, 35), taints=True, agent=quiet) as c:
        inject_xid(SimStore(c.root), 0, 48)
        inject_xid(SimStore(c.root), 5, 31)             # ignored: None, taken from 1.35
        want = {name(c, 0): [(XID, "48", "NoSchedule")], name(c, 5): [(XID, "31", "None")]}
        until(lambda: tainted(c) == want, what=lambda: f"taints {tainted(c)}")
        until(lambda: not tainted(c), timeout=20, what=lambda: f"taints {tainted(c)} after the quiet period")
        assert not c.api.rejected, c.api.rejected


def test_1_34_takes_no_none_effect():
    with started((1, 34), taints=True) as c:
        inject_xid(SimStore(c.root), 0, 48)
        inject_xid(SimStore(c.root), 5, 31)
        until(lambda: tainted(c) == {name(c, 0): [(XID, "48", "NoSchedule")]}, what=lambda: f"taints {tainted(c)}")
        assert not c.api.rejected, c.api.rejected


def test_a_server_without_device_taints_drops_them_and_the_log_says_so_once():
    with started((1, 35)) as c:                          # DRADeviceTaints alpha: off by default
        inject_xid(SimStore(c.root), 0, 48)
        says = "its DRADeviceTaints feature gate is off"
        until(lambda: says in c.plugin_log(), what="the log line")
        writes = c.api.writes
        inject_xid(SimStore(c.root), 1, 48)
        c.kubelet.plugin().wait_health(lambda e: sum(status == "UNHEALTHY" for _, _, status, *_ in e) == 2)
        # Two comparisons of the pool after the kubelet heard of it: the second began after it.
        seen = c.plugin_log().count("unchanged")
        until(lambda: c.plugin_log().count("unchanged") >= seen + 2, what="the pool compared again")
        assert c.api.writes == writes and not tainted(c) and c.plugin_log().count(says) == 1
        assert not c.api.rejected, c.api.rejected


@GPU_CHANGES
def test_taints_beside_dynamic_mig_in_a_pool_of_many_slices():
    from .test_dra_mig import apply
    with started((1, 36), plugin_args=["--dynamic-mig"]) as c:
        apply(c, "modes")                               # GPUs 0-3 in MIG mode, 4-7 whole
        until(lambda: any("-mig-" in n for n in c.devices()), what="partitions published")
        assert len(c.api.pool(DRIVER, NODE)) > 2
        store = SimStore(c.root)
        inject_xid(store, 0, 48)
        parent = c.gpus[0]["uuid"]
        partitions = {n for n, d in c.devices().items() if "-mig-" in n
                      and d["attributes"]["parentUUID"]["string"] == parent}
        until(lambda: set(tainted(c)) == partitions, what=lambda: f"taints {tainted(c)}")
        before = times(c)
        inject_xid(store, 5, 48)                        # a whole GPU, in another slice
        until(lambda: set(tainted(c)) == partitions | {name(c, 5)}, what=lambda: f"taints {tainted(c)}")
        assert {k: v for k, v in times(c).items() if k in before} == before
        whole = times(c)[(name(c, 5), XID)]
        # gpu-test4 takes a whole GPU of partitions: three fit (GPUs 1-3), not a fourth.
        claims = c.allocate(c.claims(DEMOS["gpu-test4"], 3))
        with pytest.raises(Unschedulable):
            c.allocate(c.claims(DEMOS["gpu-test4"], 1))
        for claim in claims:
            c.scheduler.deallocate(claim)
        with c.agent.client() as client:
            client.clear_health(["0"])
        until(lambda: set(tainted(c)) == {name(c, 5)}, what=lambda: f"taints {tainted(c)}")
        assert times(c)[(name(c, 5), XID)] == whole
        assert not c.api.rejected, c.api.rejected
