"""GPUs kept for VMs, served to KubeVirt as NVIDIA's kubevirt-gpu-device-plugin serves them,
pure: the agent's node view in, ``{resource: devices}`` out, and an allocation's answer.

- **Which GPUs**: those the admin keeps for VMs (``passthrough.vm_gpus`` in the agent's
  configuration; the node view's ``vfio.gpus[].for_vms``), whichever driver holds them now:
  the agent binds a GPU (and its IOMMU group) to vfio-pci when a VM's pod is given it, and
  back when the pod is gone. They are left out of ``nvidia.com/gpu`` and the MIG resources.
- **Names** (``pkg/device_plugin/device_plugin.go``, ``getDeviceName``): one resource per
  PCI device id, ``nvidia.com/<NAME>``, NAME the device's ``pci.ids`` name upper-cased,
  ``/`` and ``.`` and runs of blanks spelled ``_``, anything else but letters, digits and
  ``_`` dropped (``GA102GL [RTX A6000]`` is ``GA102GL_RTX_A6000``); the device id in hex
  without a name. Device ids are the PCI bus ids (``0000:17:00.0``).
- **Allocate** (``generic_device_plugin.go``): the VFIO device nodes of the GPUs' groups as
  device specs (host path = container path, ``mrw``): ``/dev/vfio/vfio``,
  ``/dev/vfio/<group>`` and, where the node has iommufd, ``/dev/iommu`` and each function's
  ``/dev/vfio/devices/vfio<N>``; and ``PCI_RESOURCE_NVIDIA_COM_<NAME>=<bdf>[,<bdf>...]``,
  the variable KubeVirt's virt-launcher reads (the resource name upper-cased, ``/`` and
  ``.`` spelled ``_``), the requested GPUs only, in the kubelet's order.
"""

from __future__ import annotations

import re

from .kubelet import deviceplugin_pb2 as api
from .resources import HEALTHY, UNHEALTHY, PluginDevice

__all__ = ["resource_name", "env_name", "vm_resources", "vm_gpus", "vm_response", "prefer", "NAMESPACE"]

NAMESPACE = "nvidia.com"


def resource_name(product: str | None, device_id: str) -> str:
    """``nvidia.com/<NAME>`` of a GPU whose ``pci.ids`` name is ``product`` (None, or its
    device id, when the database has none) and whose PCI device id is ``device_id``
    (``0x2230``)."""
    hex_id = device_id.lower().removeprefix("0x")
    if not product or product.lower().removeprefix("0x") == hex_id:
        return f"{NAMESPACE}/{hex_id}"
    name = product.strip().upper().replace("/", "_").replace(".", "_")
    name = re.sub(r"\s+", "_", name)
    return f"{NAMESPACE}/{re.sub(r'[^A-Za-z0-9_.]+', '', name)}"


def env_name(resource: str) -> str:
    """The variable KubeVirt reads a resource's PCI addresses from."""
    return "PCI_RESOURCE_" + resource.upper().replace("/", "_").replace(".", "_")


def vm_gpus(node: dict) -> list[dict]:
    """The node's GPUs kept for VMs (its ``vfio`` view's entries)."""
    return [g for g in (node.get("vfio") or {}).get("gpus") or () if g.get("for_vms")]


def _health(gpu: dict, node: dict, devices: dict, connected: bool, owned) -> tuple[str, str | None]:
    if not connected:
        return UNHEALTHY, "the agent is not reachable"
    if not (node.get("vfio") or {}).get("iommu") or gpu.get("iommu_group") is None:
        return UNHEALTHY, "the IOMMU is off"
    held = gpu.get("allocation")
    if held:
        return (HEALTHY, None) if owned(held) else (UNHEALTHY, f"passed through for {held}")
    if gpu.get("driver") in ("vfio-pci", "nvgrace_gpu_vfio_pci"):
        return HEALTHY, None                     # on vfio-pci already: taken as it is
    if gpu.get("driver") != "nvidia":
        return UNHEALTHY, f"its driver is {gpu.get('driver') or 'none'}"
    view = devices.get(gpu.get("uuid") or "") or {}
    if (view.get("health") or {}).get("state") == "unhealthy":
        return UNHEALTHY, view["health"].get("message") or "unhealthy"
    foreign = [a for a in view.get("allocations", ()) if not owned(a)]
    if foreign:
        return UNHEALTHY, f"allocated outside Kubernetes: {', '.join(foreign)}"
    if ((view.get("mig") or {}).get("devices")):
        return UNHEALTHY, "it has MIG devices"
    return HEALTHY, None


def vm_resources(node: dict, devices: dict, connected: bool = True,
                 owned=lambda alloc_id: False) -> dict[str, list[PluginDevice]]:
    """{resource: the GPUs kept for VMs, in PCI order}. ``node``: the agent's node view;
    ``devices``: uuid -> device view (a GPU on nvidia); ``owned(allocation id)``: this
    plugin made it (a VM's pod holds the GPU: Healthy, as KubeVirt's plugin lists it)."""
    out: dict[str, list[PluginDevice]] = {}
    for g in vm_gpus(node):
        health, why = _health(g, node, devices, connected, owned)
        out.setdefault(resource_name(g.get("product"), g["device_id"]), []).append(
            PluginDevice(g["pci_bus_id"], g.get("uuid") or g["pci_bus_id"], health, g.get("numa_node"), why))
    return out


def vm_response(alloc: dict, resource: str, ids: list[str]) -> api.ContainerAllocateResponse:
    """A VM's container answer from the agent's passthrough allocation of ``ids``."""
    r = api.ContainerAllocateResponse()
    for node in (alloc.get("container_edits") or {}).get("deviceNodes", ()):
        r.devices.add(container_path=node["path"], host_path=node.get("hostPath") or node["path"],
                      permissions="mrw")
    r.envs[env_name(resource)] = ",".join(ids)
    return r


def prefer(devices: list[PluginDevice], available: list[str], must_include: list[str], size: int) -> list[str]:
    """``size`` of ``available``: those the kubelet must include, then as few NUMA nodes as
    may be (those of the included first, then the one offering the most), in the resource's
    order, as KubeVirt's plugin prefers GPUs of one NUMA node."""
    numa = {d.id: d.numa for d in devices}
    chosen = list(dict.fromkeys(must_include))
    rest = [i for i in available if i not in chosen]
    wanted = {numa.get(i) for i in chosen}
    offered: dict = {}
    for i in rest:
        offered[numa.get(i)] = offered.get(numa.get(i), 0) + 1
    order = {i: n for n, i in enumerate(available)}
    rest.sort(key=lambda i: (numa.get(i) not in wanted, -offered[numa.get(i)], str(numa.get(i)), order[i]))
    return (chosen + rest)[:max(size, len(chosen))]
