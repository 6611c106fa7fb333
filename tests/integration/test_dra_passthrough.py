"""Passthrough through DRA, checked from outside: the agent and ``hostagent dra-plugin
--passthrough`` on a simulated DGX A100, a test kubelet, API server (1.35, partitionable
devices on) and scheduler; NVIDIA's two vfio demos unchanged.

One cluster for the module; each test leaves it as it found it (no claim, no allocation,
every GPU on nvidia).
"""

import json
import os

import pytest
import yaml

from tests.waiting import until

from .dracluster import NODE, Cluster, quickstart, running
from .drasched import Unschedulable

pytest.importorskip("celpy", reason="cel-python is in the [test] extra")

DEMOS = quickstart()
VFIO_ATTRIBUTES = {"type", "uuid", "deviceID", "vendorID", "numa", "productName", "iommuFDEnabled",
                   "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot"}


@pytest.fixture(scope="module")
def cluster():
    vfio = lambda c: until(lambda: any(n.startswith("gpu-vfio-") for n in c.devices()), timeout=15,  # noqa: E731
                           what="vfio devices")
    with running(Cluster(version=(1, 35), plugin_args=["--passthrough"]), vfio) as c:
        yield c


@pytest.fixture(autouse=True)
def clean(cluster):
    yield
    assert cluster.allocations() == [], "a test left an allocation"
    assert not cluster.api.rejected, cluster.api.rejected
    assert all(driver(cluster, bdf) == "nvidia" for bdf in gpu_bdfs(cluster))


def driver(cluster, bdf: str) -> str:
    return os.path.basename(os.readlink(cluster.root / f"sys/bus/pci/devices/{bdf}/driver"))


def gpu_bdfs(cluster) -> list[str]:
    return sorted(d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
                  for n, d in cluster.devices().items() if n.startswith("gpu-vfio-"))


def usable(cluster) -> set[str]:
    with cluster.agent.client() as c:
        return {g["pci_bus_id"].lower()[4:] for g in c.devices()["gpus"]}


def got(claim) -> str:
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return result["device"]


def gpu_claim_at(cluster, bdf: str) -> dict:
    """A gpu.nvidia.com claim for exactly the GPU at ``bdf``."""
    return cluster.claim_at(bdf, name=f"gpu-at-{bdf.replace(':', '-')}")


def spec_edits(cluster, cdi_id: str) -> dict:
    kind, _, name = cdi_id.partition("=")
    for folder in ("etc/cdi", "var/run/cdi"):
        for path in (cluster.root / folder).glob("*.json"):
            spec = yaml.safe_load(path.read_text())
            if spec["kind"] == kind:
                for d in spec["devices"]:
                    if d["name"] == name:
                        return {"device": d["containerEdits"], "spec": spec.get("containerEdits") or {}}
    raise AssertionError(f"no CDI device {cdi_id}")


def test_every_gpu_is_also_nvidias_vfio_device_drawing_on_the_gpus_counter(cluster):
    devices = cluster.devices()
    vfio = {n: d for n, d in devices.items() if n.startswith("gpu-vfio-")}
    assert sorted(vfio) == [f"gpu-vfio-{i}" for i in range(8)]
    with cluster.agent.client() as c:
        gpus = {g["pci_bus_id"].lower()[4:]: g for g in c.devices()["gpus"]}
    for name, d in vfio.items():
        a = d["attributes"]
        assert set(a) == VFIO_ATTRIBUTES and a["type"] == {"string": "vfio"}
        assert a["vendorID"] == {"string": "0x10de"} and a["deviceID"] == {"string": "0x20b0"}
        assert a["productName"] == {"string": "GA100 [A100 SXM4 40GB]"} and a["iommuFDEnabled"] == {"bool": False}
        assert set(d["capacity"]) == {"addressableMemory"}
        gpu = gpus[a["resource.kubernetes.io/pciBusID"]["string"]]
        assert a["numa"] == {"int": gpu["numa_node"]}
        # The GPU and its vfio device take all of one counter: the scheduler never gives both.
        [share] = d["consumesCounters"]
        [gpu_share] = devices[f"gpu-{gpu['minor']}"]["consumesCounters"]
        assert share == gpu_share and share["counterSet"] == f"{name}-counter-set"
    # PCI order, as NVIDIA's nvpci.GetGPUs numbers them.
    assert gpu_bdfs(cluster) == [vfio[f"gpu-vfio-{i}"]["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
                                 for i in range(8)]


def test_the_vfiopci_demo_passes_its_gpu_through_and_gives_it_back(cluster):
    [claim] = cluster.allocate(cluster.claims(DEMOS["gpu-test-vfiopci"]))
    bdf = cluster.devices()[got(claim)]["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    try:
        answers = cluster.kubelet.prepare(claim)
        [(devices, error)] = answers.values()
        assert not error, error
        [(requests, pool, device, cdi)] = devices
        assert (requests, pool, device) == (("gpu",), NODE, got(claim))
        # Bound to vfio-pci in the simulated sysfs.
        assert driver(cluster, bdf) == "vfio-pci"
        group = os.path.basename(os.readlink(cluster.root / f"sys/bus/pci/devices/{bdf}/iommu_group"))
        edits = spec_edits(cluster, cdi[0])
        paths = [n["path"] for n in edits["device"]["deviceNodes"]]
        assert paths == [f"/dev/vfio/{group}", "/dev/vfio/vfio"]
        text = json.dumps(edits)
        assert "/dev/nvidia" not in text and "libnvidia" not in text and "hooks" not in edits["spec"]
        # Meanwhile it is out of the usable inventory and no gpu.nvidia.com claim can get it.
        assert bdf not in usable(cluster)
        until(lambda: all(d["attributes"].get("resource.kubernetes.io/pciBusID") != {"string": bdf}
                          for n, d in cluster.devices().items() if not n.startswith("gpu-vfio-")),
              timeout=15, what="the GPU gone from the pool")
        with pytest.raises(Unschedulable):
            cluster.allocate([gpu_claim_at(cluster, bdf)])
        # The kubelet retries: the same answer.
        assert cluster.kubelet.prepare(claim) == answers
    finally:
        cluster.api.delete_claim("default", f"gpu-at-{bdf.replace(':', '-')}")
        cluster.forget([claim])
    # Back on nvidia, listed, and allocatable as a GPU again.
    assert driver(cluster, bdf) == "nvidia" and bdf in usable(cluster)
    until(lambda: any(d["attributes"].get("resource.kubernetes.io/pciBusID") == {"string": bdf}
                      for n, d in cluster.devices().items() if not n.startswith("gpu-vfio-")),
          timeout=15, what="the GPU back in the pool")
    [again] = cluster.allocate([gpu_claim_at(cluster, bdf)])
    try:
        [(devices, error)] = cluster.kubelet.prepare(again).values()
        assert not error and devices[0][3][0].startswith("nvidia.com/gpu=")
    finally:
        cluster.forget([again])


def test_the_vfio_config_demo_is_prepared_with_its_iommu_settings(cluster):
    [claim] = cluster.allocate(cluster.claims(DEMOS["gpu-test-vfio-config"]))
    try:
        [(devices, error)] = cluster.kubelet.prepare(claim).values()
        assert not error, error
        with cluster.agent.client() as c:
            [alloc] = [a for a in c.allocations() if a["id"] == f"k8s-dra/{claim['metadata']['uid']}"]
        # enableAPIDevice asks for iommufd's nodes too; this node has none (a 6.1 kernel without
        # iommufd), so the legacy ones are what the VM gets.
        gpu = alloc["passthrough"][0]["gpu"]
        assert alloc["request"]["devices"] == [{"passthrough": {"gpu": gpu, "iommufd": True}}]
        paths = [n["path"] for n in spec_edits(cluster, devices[0][3][0])["device"]["deviceNodes"]]
        assert paths[1:] == ["/dev/vfio/vfio"] and paths[0].startswith("/dev/vfio/")
    finally:
        cluster.forget([claim])


def test_a_gpu_another_allocation_holds_is_refused_per_claim_and_stays_on_nvidia(cluster):
    [claim] = cluster.allocate(cluster.claims(DEMOS["gpu-test-vfiopci"]))
    bdf = cluster.devices()[got(claim)]["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    with cluster.agent.client() as c:
        [uuid] = [g["uuid"] for g in c.devices()["gpus"] if g["pci_bus_id"].lower().endswith(bdf)]
        c.allocate("other-user", [uuid])
        try:
            [(devices, error)] = cluster.kubelet.prepare(claim).values()
            assert not devices and f"GPU {bdf} is in use: allocation other-user holds it" in error, error
            assert "\n" not in error
            assert driver(cluster, bdf) == "nvidia" and bdf in usable(cluster)
        finally:
            c.release("other-user")
            cluster.forget([claim])


def test_a_claim_mixing_a_vfio_device_and_a_gpu_is_refused_whole(cluster):
    spec = {"devices": {"requests": [{"name": "vm", "exactly": {"deviceClassName": "vfio.gpu.nvidia.com"}},
                                     {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    claim = cluster.api.put_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                   "metadata": {"namespace": "default", "name": "mixed"}, "spec": spec})
    [claim] = cluster.allocate([claim])
    try:
        [(devices, error)] = cluster.kubelet.prepare(claim).values()
        assert not devices and "passes GPUs through or allocates devices, not both" in error
    finally:
        cluster.forget([claim])
