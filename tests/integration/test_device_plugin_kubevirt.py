"""GPUs kept for VMs served to KubeVirt by the device plugin, checked through the test
kubelet against the real agent on a simulated node whose GPUs share their IOMMU groups with
an HD-audio function (rtx-a6000x2): kubevirt-gpu-device-plugin's resource name and device
ids, Allocate passing the GPU through and answering its VFIO device nodes and
PCI_RESOURCE_NVIDIA_COM_<NAME>, the GPU back on nvidia once no pod holds it, a GPU given
again to the next pod kept on vfio-pci, and the mark followed on reload.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest

from hostagent.sim import pcibus
from hostagent.sim.store import SimStore
from tests.waiting import until

from .agentd import AgentProcess, make_root
from .kubelet import TestKubelet


GPU, AUDIO, OTHER, OTHER_AUDIO = "0000:17:00.0", "0000:17:00.1", "0000:65:00.0", "0000:65:00.1"
VM = "nvidia.com/GA102GL_RTX_A6000"
ENV = "PCI_RESOURCE_NVIDIA_COM_GA102GL_RTX_A6000"
# The device plugin runs as root; run by another user here, it is that user, named one of
# the uids that may pass GPUs through (api.plugin_uids).
CONFIG = {"api": {"watch_heartbeat": 2, "plugin_uids": [os.getuid()] if os.getuid() else []},
          "daemon": {"resync_interval": 0}, "health": {"quiet_period": None, "wait_timeout_ms": 200}}


def driver(root, bdf: str) -> str:
    try:
        return os.path.basename(os.readlink(root / f"sys/bus/pci/devices/{bdf}/driver"))
    except OSError:
        return ""


class Node:
    def __init__(self, vm_gpus, iommufd=False):
        self.root = make_root("rtx-a6000x2")
        if iommufd:
            pcibus.set_iommu(SimStore(self.root), True, True)
        self.agent = AgentProcess(self.root, {**CONFIG, "passthrough": {"vm_gpus": vm_gpus}})
        self.dir = Path(tempfile.mkdtemp(prefix="kv-"))
        self.kubelet = TestKubelet(self.dir / "device-plugins", self.dir / "pod-resources/kubelet.sock")
        self.log = self.dir / "device-plugin.log"
        self.proc = None

    def start(self) -> "Node":
        self.agent.start()
        self.kubelet.start()
        cmd = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(self.root), "device-plugin",
               "--plugin-dir", str(self.kubelet.dir), "--pod-resources-socket", str(self.kubelet.pod_resources),
               "--reconcile-interval", "0.3", "--release-grace", "1"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        return self

    def owned(self) -> list[dict]:
        with self.agent.client() as c:
            return [a for a in c.allocations() if a["id"].startswith("k8s-device-plugin/")]

    def close(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                assert self.proc.wait(15) == 0
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
            self.kubelet.stop()
            self.agent.stop()
            self.agent.cleanup()
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running(vm_gpus, iommufd=False):
    """A node with its agent, test kubelet and device plugin for the block; the plugin's log
    printed when the block fails; all stopped and removed after."""
    n = Node(vm_gpus, iommufd).start()
    try:
        yield n
    except BaseException:
        print(n.log.read_text()[-5000:] if n.log.exists() else "")
        raise
    finally:
        n.close()


@pytest.fixture
def node():
    with running([GPU]) as n:
        yield n


def test_a_gpu_kept_for_vms_is_kubevirts_passed_through_for_a_pod_and_back_when_it_is_gone(node):
    root = node.root
    node.kubelet.endpoint(VM).wait(lambda d: d == [(GPU, "Healthy", [0])])
    with node.agent.client() as c:
        other = next(g["uuid"] for g in c.devices()["gpus"] if g["pci_bus_id"].lower().endswith(OTHER[5:]))
    # Not nvidia.com/gpu any more: only the other GPU is.
    node.kubelet.endpoint("nvidia.com/gpu").wait(lambda d: [i for i, *_ in d] == [other])
    response = node.kubelet.allocate(VM, [GPU]).container_responses[0]
    node.kubelet.pods["virt-launcher"] = {"compute": (VM, [GPU])}
    group = os.path.basename(os.readlink(root / f"sys/bus/pci/devices/{GPU}/iommu_group"))
    # The container's paths are the host's; on a simulated node the host's nodes are under its root.
    assert sorted((d.container_path, d.host_path, d.permissions) for d in response.devices) == [
        (f"/dev/vfio/{group}", str(root / f"dev/vfio/{group}"), "mrw"),
        ("/dev/vfio/vfio", str(root / "dev/vfio/vfio"), "mrw")]
    assert dict(response.envs) == {ENV: GPU} and not response.cdi_devices
    assert (driver(root, GPU), driver(root, AUDIO)) == ("vfio-pci", "vfio-pci")
    [alloc] = node.owned()
    assert alloc["labels"] == {"owner": "hostagent-device-plugin", "resource": VM}
    # The VM's pod holds it: still Healthy to the kubelet, as KubeVirt's plugin lists it.
    node.kubelet.endpoint(VM).wait(lambda d: d == [(GPU, "Healthy", [0])])
    # The pod is gone: the allocation is released and the GPU goes back to nvidia.
    node.kubelet.pods.clear()
    until(lambda: not node.owned(), timeout=15, what="the release")
    assert (driver(root, GPU), driver(root, AUDIO)) == ("nvidia", "snd_hda_intel")
    with node.agent.client() as c:
        assert len(c.devices()["gpus"]) == 2


def test_the_next_pod_given_a_gpu_keeps_it_on_vfio_and_the_rest_go_back():
    with running("all") as n:
        root = n.root
        n.kubelet.endpoint(VM).wait(lambda d: len(d) == 2)
        n.kubelet.allocate(VM, [GPU, OTHER])
        assert driver(root, GPU) == driver(root, OTHER) == "vfio-pci"
        # The kubelet gives one of them to another pod before the plugin saw the first one
        # go: the new allocation replaces the old one in one commit; the GPU it keeps stays
        # on vfio-pci, the other goes back to nvidia.
        again = n.kubelet.allocate(VM, [GPU]).container_responses[0]
        assert dict(again.envs) == {ENV: GPU}
        [alloc] = n.owned()
        assert [rec["gpu"] for rec in alloc["passthrough"]] == [GPU]
        assert [(f["bdf"], f["driver"]) for f in alloc["passthrough"][0]["functions"]] == [
            (GPU, "nvidia"), (AUDIO, "snd_hda_intel")]
        assert (driver(root, GPU), driver(root, OTHER)) == ("vfio-pci", "nvidia")
        n.kubelet.pods.clear()
        until(lambda: not n.owned(), timeout=15, what="the release")
        assert (driver(root, GPU), driver(root, AUDIO)) == ("nvidia", "snd_hda_intel")


def test_a_gpu_in_use_is_unhealthy_and_refused(node):
    node.kubelet.endpoint(VM).wait(lambda d: len(d) == 1)
    with node.agent.client() as c:
        c.allocate("api-job", ["0"])                      # GPU 0000:17:00.0 is index 0
    try:
        node.kubelet.endpoint(VM).wait(lambda d: d[0][1] == "Unhealthy")
        with pytest.raises(grpc.RpcError) as e:
            node.kubelet.allocate(VM, [GPU])
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "api-job" in e.value.details()
        assert driver(node.root, GPU) == "nvidia"
    finally:
        with node.agent.client() as c:
            c.release("api-job")
    node.kubelet.endpoint(VM).wait(lambda d: d[0][1] == "Healthy")


def test_iommufd_nodes_and_the_mark_followed_on_reload():
    with running("all", iommufd=True) as n:
        n.kubelet.endpoint(VM).wait(lambda d: [i for i, *_ in d] == [GPU, OTHER])
        assert "nvidia.com/gpu" not in n.kubelet.endpoints              # no GPU left for it
        response = n.kubelet.allocate(VM, [OTHER]).container_responses[0]
        paths = sorted(d.container_path for d in response.devices)
        # Each function of the group has its VFIO cdev (the GPU's and its audio function's).
        cdevs = [f"/dev/vfio/devices/{p.name}" for bdf in (OTHER, OTHER_AUDIO)
                 for p in (n.root / f"sys/bus/pci/devices/{bdf}/vfio-dev").iterdir()]
        assert "/dev/iommu" in paths and set(cdevs) <= set(paths) and len(cdevs) == 2
        n.kubelet.pods["vm"] = {"compute": (VM, [OTHER])}
        # Only GPU 0000:17:00.0 kept for VMs now: the other one stays KubeVirt's while its pod runs.
        n.agent.write_config({**CONFIG, "passthrough": {"vm_gpus": [GPU]}})
        n.agent.signal(signal.SIGHUP)
        until(lambda: "configuration reloaded" in n.agent.log(), what="the reload")
        n.kubelet.endpoint(VM).wait(lambda d: [i for i, *_ in d] == [GPU])
        n.kubelet.pods.clear()
        until(lambda: not n.owned(), timeout=15, what="the release")
        assert driver(n.root, OTHER) == "nvidia"
        n.kubelet.endpoint("nvidia.com/gpu").wait(lambda d: len(d) == 1)
