"""The device plugin: the agent's devices as kubelet resources, one registration per resource.

One loop (``run``) keeps the plugin in step with two things it does not control:

- **the agent** (through ``AgentLink``): every new view recomputes the resources; a new
  resource is served, then registered; a changed one sends its new list to the kubelet's
  ``ListAndWatch`` streams; one that is gone sends an empty list and stops serving;
- **the kubelet**: when its ``kubelet.sock`` is re-created (a restarted kubelet) every
  resource registers again; when a plugin socket is removed (a restarted kubelet removes
  them all) that resource serves on a new socket and registers again; a refused or failed
  ``Register`` is retried with back-off.

Every ``reconcile_interval`` it releases the allocations the kubelet no longer holds.

GPUs the admin keeps for VMs (``passthrough.vm_gpus`` in the agent's configuration) are
served to KubeVirt instead, under kubevirt-gpu-device-plugin's resource names (``kubevirt``):
``Allocate`` passes them through (the agent binds them to vfio-pci) and answers their VFIO
device nodes and ``PCI_RESOURCE_NVIDIA_COM_<NAME>``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from ..errors import HostagentError
from . import kubevirt
from .agentlink import AgentLink
from .allocations import PREFIX, Allocations, grpc_error, owned
from .kubelet import deviceplugin_pb2 as api
from .kubelet import deviceplugin_pb2_grpc as api_grpc
from .podresources import held_devices
from .resources import HEALTHY, node_resources, strategy_from_labels
from .server import PluginError, ResourceServer, socket_identity, some

__all__ = ["Options", "DevicePlugin", "register", "API_VERSION", "KUBELET_SOCKET"]

log = logging.getLogger("hostagent.plugins")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


@dataclass(frozen=True)
class Options:
    plugin_dir: Path
    agent_socket: Path
    mig_strategy: str | None = None           # None: as the agent labels the node
    device_list_strategy: tuple[str, ...] = ("cdi-cri", "envvar")
    cdi_names: str = "node"                   # or "allocation"
    shared_policy: str = "distributed"        # for replicas: or "packed"
    pod_resources_socket: Path | None = None
    allocation_expiry: float = 86400.0        # without the pod resources API; 0: never
    reconcile_interval: float = 60.0
    release_grace: float = 60.0
    poll: float = 0.5                         # how often the kubelet's sockets are looked at


def register(kubelet_socket: Path, endpoint: str, resource: str, timeout: float = 5.0) -> None:
    """``Registration.Register`` on the kubelet's socket; raises grpc.RpcError."""
    with grpc.insecure_channel(f"unix:{kubelet_socket}") as channel:
        api_grpc.RegistrationStub(channel).Register(api.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=resource,
            options=api.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=timeout)


class DevicePlugin:
    def __init__(self, options: Options, notifier=None):
        self.options = options
        self.kubelet_socket = Path(options.plugin_dir) / KUBELET_SOCKET
        self.link = AgentLink(options.agent_socket)
        self.link.owned = owned             # its own allocations change no advertised health
        self.link.own_prefix = PREFIX       # and the agent need not send their device changes
        self.allocations = Allocations(self.link, options.device_list_strategy, options.cdi_names,
                                       options.release_grace, options.allocation_expiry)
        self.notifier = notifier
        self.servers: dict[str, ResourceServer] = {}
        self.vm_resources: frozenset[str] = frozenset()    # served to KubeVirt (kubevirt.py)
        self.problems: list[str] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._kubelet = socket_identity(self.kubelet_socket)
        self._retry: dict[str, tuple[float, float]] = {}    # resource -> (next try, delay)

    # ---- answers to the kubelet (on the gRPC servers' threads) ---------------------------

    def _devices_of(self, resource: str, ids: list[str]) -> dict[str, str]:
        server = self.servers.get(resource)
        known = {d.id: d for d in (server.devices if server else ())}
        unknown = [i for i in ids if i not in known]
        if not ids or unknown:
            raise PluginError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"unknown device(s) for {resource}: {some(unknown) or 'none asked for'}")
        if len(set(ids)) != len(ids):
            from collections import Counter
            twice = [i for i, n in Counter(ids).items() if n > 1]
            raise PluginError(grpc.StatusCode.INVALID_ARGUMENT, f"device(s) asked for twice: {some(twice)}")
        asked = set(ids)        # in the resource's order, however the kubelet ordered them
        return {d.id: d.uuid for d in server.devices if d.id in asked}

    def allocate(self, resource: str, ids: list[str]):
        physical = self._devices_of(resource, ids)
        if resource in self.vm_resources:
            return self.allocations.pass_through(resource, ids)
        return self.allocations.allocate(resource, ids, physical)

    def prefer(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        self._devices_of(resource, list(dict.fromkeys([*available, *must_include])))
        if resource in self.vm_resources:
            return kubevirt.prefer(list(self.servers[resource].devices), available, must_include, size)
        try:
            return self.link.client().preferred_allocation(available, size, must_include,
                                                           self.options.shared_policy)
        except HostagentError as e:
            raise grpc_error(e) from None

    # ---- the loop ---------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> int:
        Path(self.options.plugin_dir).mkdir(parents=True, exist_ok=True)
        self.link.listeners.append(lambda view: self._wake.set())
        self.link.start()
        next_reconcile = time.monotonic() + min(self.options.reconcile_interval, 5.0)
        if self.notifier:
            self.notifier.ready(self.status())
        try:
            while not self._stop.is_set():
                self._wake.wait(self.options.poll)
                self._wake.clear()
                self.sync()
                if time.monotonic() >= next_reconcile and self.link.view.connected:
                    self.reconcile()
                    next_reconcile = time.monotonic() + self.options.reconcile_interval
                self._report()
        finally:
            if self.notifier:
                self.notifier.stopping()
            self.link.stop()
            for server in self.servers.values():
                server.stop()
            self.servers.clear()
        return 0

    def reconcile(self) -> list[str]:
        socket = self.options.pod_resources_socket
        held = held_devices(socket) if socket else None
        return self.allocations.reconcile(held)

    def sync(self) -> None:
        """One step: resources from the agent's view, sockets, registrations."""
        view = self.link.view
        strategy = self.options.mig_strategy or strategy_from_labels(view.labels)
        # GPUs kept for VMs, and their MIG devices, are KubeVirt's only.
        kept = {g["uuid"] for g in kubevirt.vm_gpus(view.node) if g.get("uuid")}
        devices = {u: d for u, d in view.devices.items() if u not in kept and d.get("parent_uuid") not in kept}
        wanted, problems = node_resources(devices, strategy, view.connected, owned)
        vms = kubevirt.vm_resources(view.node, view.devices, view.connected, owned)
        self.vm_resources = frozenset(vms)
        wanted.update(vms)
        if problems != self.problems:
            for p in problems:
                log.error("%s", p)
            self.problems = problems
        if not view.connected and view.revision is None:
            return                  # never reached the agent: nothing to say to the kubelet yet
        for name in sorted(set(self.servers) - set(wanted)):
            server = self.servers.pop(name)
            server.update(())       # capacity 0 at once, then the endpoint goes
            log.info("%s has no devices any more: stopped serving it", name)
            server.stop()
        for name, devices in sorted(wanted.items()):
            server = self.servers.get(name)
            if server is None:
                server = self.servers[name] = ResourceServer(name, self.options.plugin_dir, self)
                server.update(devices)
                server.start()
            elif server.update(devices):
                unhealthy = [d.id for d in devices if d.health != HEALTHY]
                log.info("%s: %d device(s), unhealthy: %s", name, len(devices), ", ".join(unhealthy) or "none")
        self._registrations()

    def _registrations(self) -> None:
        kubelet = socket_identity(self.kubelet_socket)
        if kubelet != self._kubelet:
            if kubelet is not None:
                log.info("the kubelet's socket %s is new: registering again", self.kubelet_socket)
            self._kubelet = kubelet
            for server in self.servers.values():
                server.registered = False
            self._retry.clear()
        for name, server in self.servers.items():
            if not server.socket_intact:
                log.info("%s's socket %s is gone: serving again", name, server.socket)
                server.stop()
                server.start()
                self._retry.pop(name, None)
            if server.registered or kubelet is None:
                continue
            due, delay = self._retry.get(name, (0.0, 0.5))
            if time.monotonic() < due:
                continue
            try:
                register(self.kubelet_socket, server.socket.name, name)
            except grpc.RpcError as e:
                log.warning("registering %s with the kubelet failed (%s: %s); again in %g s", name,
                            e.code().name if hasattr(e, "code") else "error",
                            e.details() if hasattr(e, "details") else e, delay)
                self._retry[name] = (time.monotonic() + delay, min(delay * 2, 30.0))
                continue
            server.registered = True
            self._retry.pop(name, None)
            log.info("registered %s with the kubelet (%d device(s))", name, len(server.devices))

    # ---- status -----------------------------------------------------------------------

    def status(self) -> str:
        view = self.link.view
        agent = "agent connected" if view.connected else f"agent not reachable: {view.error}"
        parts = [f"{n} ({len(s.devices)}{'' if s.registered else ', not registered'})"
                 for n, s in sorted(self.servers.items())]
        return f"{agent}; resources: {', '.join(parts) or 'none'}"

    def _report(self) -> None:
        if self.notifier is not None:
            self.notifier.status_changed(self.status())
