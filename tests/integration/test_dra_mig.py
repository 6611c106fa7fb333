"""MIG through the DRA plugin, on a simulated DGX A100: MIG devices of a layout published in
place of their GPU and NVIDIA's gpu-test4 claims (four MIG devices of one GPU each)
prepared; with --dynamic-mig on a 1.35 API server, every free placement offered as a
partition drawing on its GPU's counters, which keep the scheduler from handing out more than
a GPU holds; partitions made at their placements, kept across an agent restart, and none
left by a claim that fails.
"""

import os
import signal
import threading

import pytest

from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .dracluster import DRIVER, NODE, Cluster, quickstart

pytest.importorskip("celpy", reason="cel-python is in the [test] extra")
pytestmark = GPU_CHANGES               # MIG modes and instances

DEMOS = quickstart()
# Per GPU: what gpu-test4 asks of one parent (1g.5gb twice, 2g.10gb, 3g.20gb): the whole GPU.
LAYOUT = {"version": "v1", "mig-configs": {
    "demo": [{"devices": [0, 1, 2, 3], "mig-enabled": True,
              "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
             {"devices": [4, 5, 6, 7], "mig-enabled": False}],
    "modes": [{"devices": [0, 1, 2, 3], "mig-enabled": True, "mig-devices": {}},
              {"devices": [4, 5, 6, 7], "mig-enabled": False}],
    "whole": [{"devices": "all", "mig-enabled": False}]}}


def slice_comparisons(cluster, since: int) -> int:
    """The plugin's comparisons of its slices with the API server's since request ``since``
    (each a list of the slices, not a watch)."""
    return sum(1 for m, path, q in cluster.api.requests[since:]
               if m == "GET" and path.endswith("/resourceslices") and q.get("watch") != "true")


def apply(cluster, config):
    with cluster.agent.client(timeout=None) as c:
        c.mig_apply(config, spec=LAYOUT)
        return c.devices()


def test_quickstart_gpu_test4_on_mig_devices_of_a_layout():
    cluster = Cluster()
    try:
        cluster.start()
        cluster.kubelet.plugin()
        generation = until(lambda: cluster.api.complete(DRIVER, NODE) and cluster.api.pool(DRIVER, NODE))[0][
            "spec"]["pool"]["generation"]
        listing = apply(cluster, "demo")
        migs = {m["uuid"]: m for m in listing["mig_devices"]}
        assert len(migs) == 16
        until(lambda: len([n for n in cluster.devices() if "-mig-" in n]) == 16, what="the MIG devices published")
        devices = cluster.devices()
        assert cluster.api.pool(DRIVER, NODE)[0]["spec"]["pool"]["generation"] > generation
        assert len(devices) == 16 + 4                   # GPUs 0-3 are their MIG devices now
        claims = cluster.allocate(cluster.claims(DEMOS["gpu-test4"]))
        try:
            answers = cluster.kubelet.prepare(*claims)
            assert all(not error for _, error in answers.values()), answers
            parents = []
            known = cluster.cdi_devices()
            for c in claims:
                prepared, _ = answers[c["metadata"]["uid"]]
                assert sorted(r for (r,), *_ in prepared) == ["mig-1g-5gb-0", "mig-1g-5gb-1", "mig-2g-10gb",
                                                                "mig-3g-20gb"]
                uuids = {devices[d]["attributes"]["uuid"]["string"] for _, _, d, _ in prepared}
                parents.append({migs[u]["parent_uuid"] for u in uuids})
                assert all(cdi[0] in known for *_, cdi in prepared)
            assert all(len(p) == 1 for p in parents) and len(set.union(*parents)) == 4   # one GPU each
            assert len(cluster.allocations()) == 4
        finally:
            cluster.forget(claims)
        assert cluster.allocations() == []
        apply(cluster, "whole")
        until(lambda: list(cluster.devices()) == [f"gpu-{g['minor']}" for g in listing["gpus"]],
             what="the whole GPUs published again")
    except BaseException:
        print(cluster.plugin_log()[-6000:])
        raise
    finally:
        cluster.close()


def test_dynamic_mig_offers_partitions_the_scheduler_cannot_overcommit():
    cluster = Cluster(version=(1, 35), plugin_args=["--dynamic-mig"])
    try:
        cluster.start()
        cluster.kubelet.plugin()
        listing = apply(cluster, "modes")
        gpus = listing["gpus"]
        until(lambda: any("-mig-" in n for n in cluster.devices()), what="partitions published")
        slices = cluster.api.pool(DRIVER, NODE)
        # 1.35: the counter sets in a slice of their own, first; no slice has both.
        assert slices[0]["spec"].get("sharedCounters") and not slices[0]["spec"].get("devices")
        assert not any(s["spec"].get("sharedCounters") and s["spec"].get("devices") for s in slices)
        assert {c["name"] for c in slices[0]["spec"]["sharedCounters"]} == {
            f"gpu-{g['minor']}-counter-set" for g in gpus[:4]}
        devices = cluster.devices()
        partitions = [d for d in devices.values() if d.get("consumesCounters")]
        assert len(partitions) == 4 * 25 and all("uuid" not in d["attributes"] for d in partitions)
        # gpu-test4 needs all of a GPU: four claims fit (one GPU each), a fifth does not.
        claims = cluster.allocate(cluster.claims(DEMOS["gpu-test4"]))
        parents = [{devices[r["device"]]["attributes"]["parentUUID"]["string"]
                    for r in c["status"]["allocation"]["devices"]["results"]} for c in claims]
        assert all(len(p) == 1 for p in parents) and len(set.union(*parents)) == 4
        from .drasched import Unschedulable
        with pytest.raises(Unschedulable):
            cluster.allocate(cluster.claims(DEMOS["gpu-test4"], 1))
        # Prepared, each claim's partitions are made at exactly their placements; the pool
        # does not change (a made device stands as its partition), nor does an agent restart.
        writes = cluster.api.writes
        answers = cluster.kubelet.prepare(*claims)
        assert all(not error for _, error in answers.values()), answers
        with cluster.agent.client() as c:
            migs = c.devices(type="mig")["mig_devices"]
        assert len(migs) == 16 and all(m["made_for"].startswith("k8s-dra/") for m in migs)
        known = cluster.cdi_devices()
        for c in claims:
            [alloc] = [a for a in cluster.allocations() if a["id"] == f"k8s-dra/{c['metadata']['uid']}"]
            results = c["status"]["allocation"]["devices"]["results"]
            wanted = sorted((devices[r["device"]]["attributes"]["profile"]["string"],
                             int(r["device"].rsplit("-", 1)[1])) for r in results)
            assert sorted((m["profile"], m["start"]) for m in alloc["made"]) == wanted
            prepared, _ = answers[c["metadata"]["uid"]]
            assert all(cdi[0] in known for *_, cdi in prepared)
        # The kubelet asks again after a kill -9 of the agent: the same MIG devices, the same answers.
        cluster.agent.kill()
        cluster.agent.start()
        assert cluster.kubelet.prepare(*claims) == answers
        with cluster.agent.client() as c:
            assert sorted(m["uuid"] for m in c.devices(type="mig")["mig_devices"]) == sorted(m["uuid"] for m in migs)
        cluster.forget(claims)
        with cluster.agent.client() as c:
            assert c.devices(type="mig")["mig_devices"] == []
        # A claim that fails once its partitions are made (two MPS devices of one claim with two
        # mpsConfigs, which one daemon cannot serve) leaves nothing made.
        a, b = sorted(n for n, d in devices.items() if d.get("consumesCounters")
                      and d["attributes"]["parentUUID"]["string"] == gpus[0]["uuid"]
                      and d["attributes"]["profile"]["string"] == "1g.5gb")[:2]
        mps = [{"source": "FromClaim", "requests": [r], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}}}}}
            for r, pct in (("a", 10), ("b", 20))]
        bad = cluster.api.put_claim({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "default", "name": "two-mps-configs"}, "spec": {},
            "status": {"allocation": {"devices": {"config": mps, "results": [
                {"request": r, "driver": DRIVER, "pool": NODE, "device": d} for r, d in (("a", a), ("b", b))]}}}})
        [(devices_, error)] = cluster.kubelet.prepare(bad).values()
        assert not devices_ and "one mpsConfig" in error, error
        assert f"MIG devices made for k8s-dra/{bad['metadata']['uid']} destroyed: its allocation failed" in \
            cluster.agent.log()
        with cluster.agent.client() as c:
            assert c.devices(type="mig")["mig_devices"] == []
        assert cluster.allocations() == []
        cluster.api.delete_claim("default", "two-mps-configs")
        lists = len(cluster.api.requests)
        until(lambda: slice_comparisons(cluster, lists) >= 2, what="two comparisons of the slices")
        assert cluster.api.writes == writes
        assert not cluster.api.rejected
    except BaseException:
        print(cluster.plugin_log()[-6000:])
        raise
    finally:
        cluster.close()


def mps_partition_claim(cluster, devices, gpu_uuid, name):
    """A claim of one 1g.5gb partition of the GPU, shared with MPS (a daemon of its own)."""
    [part] = sorted(n for n, d in devices.items() if d.get("consumesCounters")
                    and d["attributes"]["parentUUID"]["string"] == gpu_uuid
                    and d["attributes"]["profile"]["string"] == "1g.5gb")[:1]
    config = [{"source": "FromClaim", "requests": ["p"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}}}]
    return cluster.api.put_claim({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": name}, "spec": {},
        "status": {"allocation": {"devices": {"config": config, "results": [
            {"request": "p", "driver": DRIVER, "pool": NODE, "device": part}]}}}})


def made_and_daemons(cluster) -> tuple[list[str], list[int]]:
    """The node's MIG devices and the MPS control daemons that run on it."""
    from .mpsprocs import running
    with cluster.agent.client() as c:
        return sorted(m["uuid"] for m in c.devices(type="mig")["mig_devices"]), running(cluster.root)


def test_a_kill9_mid_prepare_of_a_partition_with_mps_orphans_nothing():
    """kill -9 of the DRA plugin, then of the agent, while a claim of a MIG partition shared
    with MPS is prepared (its MIG device made, its MPS daemon started, its spec written, its
    allocation not yet committed). The kubelet's retry gets the same device, and no MIG
    device or MPS daemon is left that no allocation has."""
    cluster = Cluster(version=(1, 35), plugin_args=["--dynamic-mig"])
    try:
        cluster.start()
        cluster.kubelet.plugin()
        gpus = apply(cluster, "modes")["gpus"]
        until(lambda: any("-mig-" in n for n in cluster.devices()), what="partitions published")
        devices = cluster.devices()

        # The plugin killed while the agent is held at the commit; the agent then goes on.
        claim = mps_partition_claim(cluster, devices, gpus[0]["uuid"], "plugin-killed")
        cluster.agent.stop()
        cluster.agent.env = {"HOSTAGENT_FAULT": "allocate:after_spec=stop"}
        cluster.agent.start()
        before = cluster.kubelet.plugin().number
        asking = threading.Thread(target=lambda: _quietly(lambda: cluster.kubelet.prepare(claim, timeout=60)))
        asking.start()
        until(lambda: _stopped(cluster.agent.proc.pid), what="the agent held before the commit")
        cluster.proc.kill()
        cluster.proc.wait()
        os.kill(cluster.agent.proc.pid, signal.SIGCONT)
        asking.join(60)
        cluster.start_plugin()
        cluster.kubelet.plugin(after=before + 1)
        [(prepared, error)] = cluster.kubelet.prepare(claim).values()
        assert not error and [d for _, _, d, _ in prepared] == [claim["status"]["allocation"]["devices"]["results"][0]
                                                                ["device"]]
        assert cluster.kubelet.prepare(claim) == {claim["metadata"]["uid"]: (prepared, "")}     # and again
        [alloc] = cluster.allocations()
        migs, daemons = made_and_daemons(cluster)
        assert migs == [m["uuid"] for m in alloc["made"]] and len(daemons) == 1
        cluster.forget([claim])
        assert made_and_daemons(cluster) == ([], [])

        # The agent killed at the same point: the next start undoes what it made; the retry makes it again.
        claim = mps_partition_claim(cluster, devices, gpus[1]["uuid"], "agent-killed")
        cluster.agent.stop()
        cluster.agent.env = {"HOSTAGENT_FAULT": "allocate:after_spec"}
        cluster.agent.start()
        [(prepared, error)] = cluster.kubelet.prepare(claim).values()
        assert not prepared and error
        assert cluster.agent.proc.wait(10) == -9
        cluster.agent.env = {}
        cluster.agent.start()
        assert made_and_daemons(cluster) == ([], [])      # the made device destroyed, the daemon stopped
        assert "stopped: no allocation has it" in cluster.agent.log()
        [(prepared, error)] = cluster.kubelet.prepare(claim).values()
        assert not error and [d for _, _, d, _ in prepared] == [claim["status"]["allocation"]["devices"]["results"][0]
                                                                ["device"]]
        [alloc] = cluster.allocations()
        migs, daemons = made_and_daemons(cluster)
        assert migs == [m["uuid"] for m in alloc["made"]] and len(daemons) == 1
        cluster.forget([claim])
        assert made_and_daemons(cluster) == ([], [])
        cluster.api.delete_claim("default", "plugin-killed")
    except BaseException:
        print(cluster.plugin_log()[-6000:])
        raise
    finally:
        cluster.close()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:            # the plugin killed mid-call: the kubelet's call fails, as it should
        pass
