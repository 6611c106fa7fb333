"""A test kubelet: the device manager's side of the device plugin API v1beta1, as a plugin
sees it, plus the pod resources API.

- A ``Registration`` server on ``DIR/kubelet.sock``. ``Register`` checks the version and the
  endpoint, then dials the plugin's socket back, asks its options and follows its
  ``ListAndWatch`` stream in a thread (as the kubelet does), keeping every list it sends.
- ``restart()`` does what a kubelet restart does to a plugin: the registration server goes,
  every socket in the directory is removed, a new ``kubelet.sock`` appears.
- ``allocate`` and ``prefer`` call the plugin as the kubelet does at pod admission.
- A ``PodResourcesLister`` on ``pod-resources/kubelet.sock`` answers ``List`` from ``pods``.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from hostagent.plugins.kubelet import deviceplugin_pb2 as api
from hostagent.plugins.kubelet import deviceplugin_pb2_grpc as api_grpc
from hostagent.plugins.kubelet import podresources_pb2 as pr
from hostagent.plugins.kubelet import podresources_pb2_grpc as pr_grpc

__all__ = ["TestKubelet", "Endpoint"]


class Endpoint:
    """One registered resource: the plugin's socket dialed back, and what it listed."""

    def __init__(self, kubelet: "TestKubelet", request, number: int):
        self.request = request
        self.number = number              # its place in kubelet.registrations
        self.resource = request.resource_name
        self.channel = grpc.insecure_channel(f"unix:{kubelet.dir / request.endpoint}")
        self.stub = api_grpc.DevicePluginStub(self.channel)
        self.options = self.stub.GetDevicePluginOptions(api.Empty(), timeout=5)
        self.lists: list[list] = []
        self.changed = threading.Condition()
        self.ended = False
        self._stream = self.stub.ListAndWatch(api.Empty())
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        try:
            for response in self._stream:
                with self.changed:
                    self.lists.append([(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in response.devices])
                    self.changed.notify_all()
        except grpc.RpcError:
            pass
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def wait(self, predicate, timeout: float = 15.0) -> list:
        """The first list (the latest first) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                if self.lists and predicate(self.lists[-1]):
                    return self.lists[-1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.resource}: no list as wanted in {timeout} s; last: "
                                         f"{self.lists[-1] if self.lists else None}")
                self.changed.wait(left)

    def close(self) -> None:
        self._stream.cancel()
        self.channel.close()


class _Registration(api_grpc.RegistrationServicer):
    def __init__(self, kubelet: "TestKubelet"):
        self.kubelet = kubelet

    def Register(self, request, context):
        k = self.kubelet
        k.registrations.append(request)
        if k.refuse:
            context.abort(grpc.StatusCode.UNAVAILABLE, k.refuse)
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        if "/" in request.endpoint or not (k.dir / request.endpoint).exists():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no socket {request.endpoint!r}")
        old = k.endpoints.get(request.resource_name)
        if old is not None:
            old.close()
        k.endpoints[request.resource_name] = Endpoint(k, request, len(k.registrations) - 1)
        with k.registered:
            k.registered.notify_all()
        return api.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: "TestKubelet"):
        self.kubelet = kubelet

    def List(self, request, context):
        self.kubelet.listed += 1                 # how many times a plugin asked (its reconciles)
        reply = pr.ListPodResourcesResponse()
        for pod, containers in self.kubelet.pods.items():
            p = reply.pod_resources.add(name=pod, namespace="default")
            for name, (resource, ids) in containers.items():
                p.containers.add(name=name).devices.add(resource_name=resource, device_ids=ids)
        return reply


class TestKubelet:
    __test__ = False          # not a pytest class

    def __init__(self, plugin_dir: Path, pod_resources: Path | None = None):
        self.dir = Path(plugin_dir)
        self.socket = self.dir / "kubelet.sock"
        self.pod_resources = pod_resources
        self.registrations: list = []
        self.endpoints: dict[str, Endpoint] = {}
        self.registered = threading.Condition()
        self.pods: dict[str, dict[str, tuple[str, list[str]]]] = {}    # pod -> container -> (resource, ids)
        self.listed = 0                          # pod resources List calls answered
        self.refuse: str | None = None      # a reason to refuse Register with
        self._servers: list[grpc.Server] = []

    def start(self) -> "TestKubelet":
        self.dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        api_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        if self.pod_resources is not None:
            self.pod_resources.parent.mkdir(parents=True, exist_ok=True)
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
            self.pod_resources.unlink(missing_ok=True)
            server.add_insecure_port(f"unix:{self.pod_resources}")
        server.start()
        self._servers.append(server)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop(0).wait()
        self._servers.clear()
        for e in self.endpoints.values():
            e.close()
        self.endpoints.clear()
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """As a kubelet restart: stop, remove every socket in the plugin directory, start."""
        self.stop()
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".sock"):
                os.unlink(entry.path)
        self.start()

    def endpoint(self, resource: str, timeout: float = 15.0, after: int = 0) -> Endpoint:
        """The endpoint of ``resource`` once registered (by registration number ``after`` or later)."""
        deadline = time.monotonic() + timeout
        with self.registered:
            while True:
                e = self.endpoints.get(resource)
                if e is not None and e.number >= after:
                    return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{resource} did not register in {timeout} s; registered: "
                                         f"{[r.resource_name for r in self.registrations]}")
                self.registered.wait(left)

    def allocate(self, resource: str, *containers: list[str]):
        request = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=ids)
                                                          for ids in containers])
        return self.endpoints[resource].stub.Allocate(request, timeout=10)

    def prefer(self, resource: str, available: list[str], size: int, must_include=()) -> list[str]:
        request = api.PreferredAllocationRequest(container_requests=[api.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=list(must_include), allocation_size=size)])
        return list(self.endpoints[resource].stub.GetPreferredAllocation(request, timeout=10)
                    .container_responses[0].deviceIDs)
