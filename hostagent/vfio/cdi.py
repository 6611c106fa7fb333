"""What a container running a VM gets with a passed-through GPU: its IOMMU group's device
nodes, and nothing of NVIDIA's (no /dev/nvidia*, library or hook: the GPU belongs to the
guest's driver).

- Legacy VFIO (always): ``/dev/vfio/<group>`` and the container device ``/dev/vfio/vfio``,
  without which a group cannot be used (VFIO_GROUP_SET_CONTAINER, vfio.rst). NVIDIA's DRA
  driver adds ``/dev/vfio/vfio`` only with ``enableAPIDevice``; KubeVirt's device plugin
  always gives both, as here.
- iommufd, where the node has it (``/dev/iommu``) and the request asks for it (a backend
  policy preferring iommufd, or the API device): ``/dev/iommu`` and the cdev
  ``/dev/vfio/devices/vfio<N>`` of each function of the group on vfio-pci.
- ``NVIDIA_VISIBLE_DEVICES=void``, as NVIDIA's DRA driver sets, so a runtime that still
  honours the variable (nvidia-container-runtime's legacy mode) adds no GPU of its own.
"""

from __future__ import annotations

import os

from ..cdi.discover import device_node
from ..cdi.edits import Edits
from ..hostroot import HostRoot

__all__ = ["passthrough_edits"]


def _cdevs(host: HostRoot, functions: list[str]) -> list[str]:
    out = []
    for bdf in functions:
        try:
            out += sorted(p.name for p in host.host(f"/sys/bus/pci/devices/{bdf}/vfio-dev").iterdir())
        except OSError:
            continue
    return out


def passthrough_edits(host: HostRoot, group: int, functions: list[str], iommufd: bool) -> Edits:
    """The edits for one passed-through GPU whose group is ``group`` and whose group's
    functions are ``functions``; ``iommufd``: the request wants iommufd's nodes too."""
    paths = [f"/dev/vfio/{group}", "/dev/vfio/vfio"]
    if iommufd and os.path.exists(host.dev("iommu")):
        paths += ["/dev/iommu", *(f"/dev/vfio/devices/{c}" for c in _cdevs(host, functions))]
    return Edits(env=("NVIDIA_VISIBLE_DEVICES=void",),
                 device_nodes=tuple(device_node(host, p) for p in paths))
