"""Which devices running containers hold, from the kubelet's pod resources API
(``PodResourcesLister.List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``): device
plugin resources by device id, and DRA claims by the devices allocated to them."""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from .kubelet import podresources_pb2 as api
from .kubelet import podresources_pb2_grpc as api_grpc

__all__ = ["DEFAULT_SOCKET", "held_devices", "Claim", "Holding", "PodResourcesClient", "Unanswered"]

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


# PodResourcesClient.list() -> Holding.claims
@dataclass(frozen=True)
class Claim:
    """One device of a DRA claim a container uses, as the kubelet reports it."""
    name: str                             # the ResourceClaim's
    namespace: str
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]          # fully qualified CDI names the driver answered


# PodResourcesClient.list()
@dataclass(frozen=True)
class Holding:
    """What one container holds."""
    pod: str
    namespace: str
    container: str
    device_ids: tuple[str, ...]           # device plugin ids, of every resource
    claims: tuple[Claim, ...] = ()


class Unanswered(Exception):
    """The kubelet's API gave no list: ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class PodResourcesClient:
    """One channel to the kubelet, kept between calls (gRPC reconnects it after a kubelet
    restart)."""

    def __init__(self, socket_path: str | os.PathLike):
        self.path = os.fspath(socket_path)
        self._channel = None

    def list(self, timeout: float) -> list[Holding]:
        """Every container's holdings; raises Unanswered (no socket, too slow, an error)."""
        if not os.path.exists(self.path):
            self.close()
            raise Unanswered(f"no kubelet pod resources socket at {self.path}")
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix:{self.path}")
        stub = api_grpc.PodResourcesListerStub(self._channel)
        try:
            reply = stub.List(api.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unanswered(f"the kubelet did not answer List within {timeout:g} s") from None
            raise Unanswered(f"List failed: {code.name if code else e}: "
                             f"{e.details() if hasattr(e, 'details') else ''}".rstrip(": ")) from None
        return [Holding(pod.name, pod.namespace, c.name,
                        tuple(i for d in c.devices for i in d.device_ids),
                        tuple(Claim(r.claim_name, r.claim_namespace, cr.driver_name, cr.pool_name, cr.device_name,
                                    tuple(d.name for d in cr.cdi_devices))
                              for r in c.dynamic_resources for cr in r.claim_resources))
                for pod in reply.pod_resources for c in pod.containers]

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
