"""GPUs kept for VMs as NVIDIA's kubevirt-gpu-device-plugin serves them: its resource names
(its tests' examples), the variable KubeVirt reads, health from the agent's views, NUMA-first
preference."""

import pytest

from hostagent.plugins.kubevirt import env_name, prefer, resource_name, vm_resources, vm_response
from hostagent.plugins.resources import PluginDevice


@pytest.mark.parametrize("product, device_id, want", [
    ("GK104GL [GRID K520]", "0x118a", "nvidia.com/GK104GL_GRID_K520"),       # its tests
    ("GH100 [H100 PCIe]", "0x2331", "nvidia.com/GH100_H100_PCIE"),
    ("GA100 [A100 SXM4 40GB]", "0x20b0", "nvidia.com/GA100_A100_SXM4_40GB"),    # the example
    ("GA102GL [RTX A6000]", "0x2230", "nvidia.com/GA102GL_RTX_A6000"),
    ("TU104GL [Tesla T4]", "0x1eb8", "nvidia.com/TU104GL_TESLA_T4"),
    ("GV100GL [Tesla V100 SXM2 32GB]", "0x1db5", "nvidia.com/GV100GL_TESLA_V100_SXM2_32GB"),
    ("AD102GL [L40S] / weird+name", "0x26b9", "nvidia.com/AD102GL_L40S___WEIRDNAME"),
    ("0x2230", "0x2230", "nvidia.com/2230"),                                    # no pci.ids entry
    (None, "0x2230", "nvidia.com/2230"),
])
def test_resource_names_as_kubevirts_plugin_makes_them(product, device_id, want):
    assert resource_name(product, device_id) == want


def test_the_variable_kubevirt_reads():
    assert env_name("nvidia.com/GA102GL_RTX_A6000") == "PCI_RESOURCE_NVIDIA_COM_GA102GL_RTX_A6000"
    assert env_name("nvidia.com/2230") == "PCI_RESOURCE_NVIDIA_COM_2230"


def gpu(bdf, **kw):
    return {"pci_bus_id": bdf, "device_id": "0x2230", "product": "GA102GL [RTX A6000]", "driver": "nvidia",
            "iommu_group": 24, "numa_node": 0, "uuid": f"GPU-{bdf}", "for_vms": True, "allocation": None, **kw}


def node(*gpus, iommu=True):
    return {"vfio": {"iommu": iommu, "iommufd": False, "vfio_pci": True, "gpus": list(gpus)}}


def health(found):
    return {d.id: (d.health, d.why) for ds in found.values() for d in ds}


def test_which_gpus_and_their_health():
    mine = "k8s-device-plugin/x"
    n = node(gpu("0000:17:00.0"), gpu("0000:65:00.0", for_vms=False), gpu("0000:b3:00.0", numa_node=1),
             gpu("0000:ca:00.0", driver="vfio-pci", allocation=mine, uuid="GPU-ca"),
             gpu("0000:ca:01.0", driver="vfio-pci", allocation="k8s-dra/claim"),
             gpu("0000:ca:02.0", driver="vfio-pci"))
    views = {"GPU-0000:b3:00.0": {"health": {"state": "unhealthy", "message": "XID 79"}, "allocations": []}}
    found = vm_resources(n, views, owned=lambda a: a == mine)
    assert list(found) == ["nvidia.com/GA102GL_RTX_A6000"]
    [devices] = found.values()
    assert [(d.id, d.numa) for d in devices] == [("0000:17:00.0", 0), ("0000:b3:00.0", 1), ("0000:ca:00.0", 0),
                                                 ("0000:ca:01.0", 0), ("0000:ca:02.0", 0)]
    assert health(found) == {"0000:17:00.0": ("Healthy", None), "0000:b3:00.0": ("Unhealthy", "XID 79"),
                             "0000:ca:00.0": ("Healthy", None),
                             "0000:ca:01.0": ("Unhealthy", "passed through for k8s-dra/claim"),
                             "0000:ca:02.0": ("Healthy", None)}
    views = {"GPU-0000:17:00.0": {"health": {"state": "healthy"}, "allocations": ["api-job"]}}
    assert health(vm_resources(node(gpu("0000:17:00.0")), views))["0000:17:00.0"] == (
        "Unhealthy", "allocated outside Kubernetes: api-job")
    assert health(vm_resources(node(gpu("0000:17:00.0")), {}, connected=False))["0000:17:00.0"][0] == "Unhealthy"
    assert health(vm_resources(node(gpu("0000:17:00.0"), iommu=False), {}))["0000:17:00.0"] == (
        "Unhealthy", "the IOMMU is off")


def test_allocate_answers_the_vfio_nodes_and_the_addresses():
    alloc = {"container_edits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": [
        {"path": "/dev/vfio/24", "hostPath": "/dev/vfio/24", "permissions": "rwm"},
        {"path": "/dev/vfio/vfio", "hostPath": "/dev/vfio/vfio", "permissions": "rwm"}]}}
    r = vm_response(alloc, "nvidia.com/GA102GL_RTX_A6000", ["0000:65:00.0", "0000:17:00.0"])
    assert [(d.host_path, d.container_path, d.permissions) for d in r.devices] == [
        ("/dev/vfio/24", "/dev/vfio/24", "mrw"), ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw")]
    assert dict(r.envs) == {"PCI_RESOURCE_NVIDIA_COM_GA102GL_RTX_A6000": "0000:65:00.0,0000:17:00.0"}
    assert not r.cdi_devices and not r.mounts


def test_preference_keeps_a_vm_on_one_numa_node():
    devices = [PluginDevice(f"b{i}", f"b{i}", "Healthy", i // 2) for i in range(6)]   # NUMA 0, 0, 1, 1, 2, 2
    assert prefer(devices, ["b0", "b2", "b3", "b4"], [], 2) == ["b2", "b3"]           # one node holds both
    assert prefer(devices, ["b0", "b1", "b2", "b3"], ["b3"], 2) == ["b3", "b2"]        # the included one's node
    assert prefer(devices, ["b0", "b2", "b4"], [], 2)[:1] == ["b0"]


def test_a_plugin_the_agent_does_not_let_pass_gpus_through_hears_permission_denied():
    import grpc
    from hostagent.errors import PermissionDenied
    from hostagent.plugins.allocations import grpc_error
    e = grpc_error(PermissionDenied("only root or a uid of api.plugin_uids may pass a GPU through"))
    assert e.code == grpc.StatusCode.PERMISSION_DENIED and "api.plugin_uids" in e.message
