"""Which device sets running containers hold, from the kubelet's pod resources API
(``PodResourcesLister.List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``)."""

from __future__ import annotations

import os

import grpc

from .kubelet import podresources_pb2 as api
from .kubelet import podresources_pb2_grpc as api_grpc

__all__ = ["DEFAULT_SOCKET", "held_devices"]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def held_devices(socket_path: str | os.PathLike, timeout: float = 5.0) -> set[tuple[str, frozenset]] | None:
    """{(resource name, frozenset of device ids)} of every container, or None when the API
    cannot be reached (no socket, no answer, an error)."""
    path = os.fspath(socket_path)
    if not os.path.exists(path):
        return None
    try:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            reply = api_grpc.PodResourcesListerStub(channel).List(api.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError:
        return None
    return {(d.resource_name, frozenset(d.device_ids))
            for pod in reply.pod_resources for c in pod.containers for d in c.devices}
