"""The DRA plugin's claims on the agent's metrics page: the CDI names NodePrepareResources
answers (the node spec's for a time-sliced GPU, the claim's own spec's for an MPS one) are
the names the kubelet's pod resources API reports, and the agent labels each device's series
with the pod and the claim."""

import pytest

from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .dracluster import AGENT, NODE, Cluster, quickstart
from .test_metrics_pods import SOCKET, PodResources, labels_of, parse

pytest.importorskip("celpy", reason="cel-python is in the [test] extra")


@GPU_CHANGES                            # gpu-test5's MPS daemon: its GPU in EXCLUSIVE_PROCESS
def test_a_prepared_claims_devices_carry_their_pod_and_claim():
    cluster = Cluster(agent_config={**AGENT, "metrics": {"interval": 1, "kubernetes": True}})
    kubelet = PodResources(cluster.agent.host.host(SOCKET))
    try:
        cluster.start()
        cluster.kubelet.plugin()
        devices = cluster.devices()
        [claim] = cluster.allocate(cluster.claims(quickstart()["gpu-test5"]))
        [(prepared, error)] = cluster.kubelet.prepare(claim).values()
        assert not error
        name = claim["metadata"]["name"]
        kubelet.pods = [("pod0", "gpu-test5", "ctr0", [],
                         [(name, "gpu-test5", "gpu.nvidia.com", pool, device, list(cdi))
                          for _, pool, device, cdi in prepared])]
        index = {device: str(devices[device]["attributes"]["index"]["int"]) for _, _, device, _ in prepared}

        def labelled():
            """Each prepared device's series, once they all carry a pod."""
            with cluster.agent.client() as c:
                fams = parse(c.metrics())
            found = {d: labels_of(fams, "DCGM_FI_DEV_GPU_TEMP", gpu=i)[0] for d, i in index.items()}
            return found if all("pod" in s for s in found.values()) else None

        found = until(labelled, timeout=15, interval=0.2, what="pod labels on the claim's devices")
        for device, s in found.items():
            assert (s.get("pod"), s.get("dra_claim_name"), s.get("dra_pool_name"), s.get("dra_device_name")) == (
                "pod0", name, NODE, device)
            assert s["allocation"] == f"k8s-dra/{claim['metadata']['uid']}"
        cluster.forget([claim])
        assert cluster.stop_plugin() == 0
    except BaseException:
        print(cluster.plugin_log()[-6000:])
        raise
    finally:
        kubelet.server.stop(0).wait()
        cluster.close()
