"""A test kubelet: the DRA side, as a DRA plugin sees it.

- A plugin watcher on the registry folder: a new socket is asked ``GetInfo``; a ``DRAPlugin``
  whose name and endpoint are valid gets the first DRA service version this kubelet speaks
  (``dra_versions``) and the best health service it speaks, is told
  ``NotifyRegistrationStatus``, and its endpoint is dialed; ``NodeWatchResources`` is
  followed in a thread, every list kept.
- ``prepare``/``unprepare`` call the plugin as the kubelet does before and after a pod.
- ``restart()`` does what a kubelet restart does: everything dropped, the node's slices
  deleted from the API server, the registry folder made again (``recreate``), the plugin
  found again.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import grpc

from hostagent.plugins.kubelet import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from hostagent.plugins.kubelet import drahealth_v1_pb2, drahealth_v1_pb2_grpc, drahealth_v1alpha1_pb2
from hostagent.plugins.kubelet import drahealth_v1alpha1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

__all__ = ["TestKubelet", "Plugin"]

DRA = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
HEALTH = {"v1.DRAResourceHealth": (drahealth_v1_pb2, drahealth_v1_pb2_grpc),
          "v1alpha1.DRAResourceHealth": (drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc)}


class Plugin:
    """One registered plugin: its info, the versions chosen, its health lists."""

    def __init__(self, info, number: int, dra_version: str, health_version: str | None):
        self.info = info
        self.number = number
        self.dra_version = dra_version
        self.health_version = health_version
        self.channel = grpc.insecure_channel(f"unix:{info.endpoint}")
        self.api, grpc_module = DRA[dra_version]
        self.stub = grpc_module.DRAPluginStub(self.channel)
        self.health: list[list[tuple]] = []
        self.changed = threading.Condition()
        self._stream = None
        if health_version:
            api, grpc_module = HEALTH[health_version]
            self._stream = grpc_module.DRAResourceHealthStub(self.channel).NodeWatchResources(
                api.NodeWatchResourcesRequest())
            threading.Thread(target=self._follow, args=(api,), daemon=True).start()

    def _follow(self, api) -> None:
        try:
            for response in self._stream:
                with self.changed:
                    self.health.append([(d.device.pool_name, d.device.device_name, api.HealthStatus.Name(d.health),
                                         d.message, d.last_updated_time, d.health_check_timeout_seconds)
                                        for d in response.devices])
                    self.changed.notify_all()
        except grpc.RpcError:
            pass

    def wait_health(self, predicate, timeout: float = 15.0) -> list:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                if self.health and predicate(self.health[-1]):
                    return self.health[-1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no health list as wanted in {timeout} s; last: "
                                         f"{self.health[-1] if self.health else None}")
                self.changed.wait(left)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        self.channel.close()


class TestKubelet:
    __test__ = False

    def __init__(self, registry: Path, api_server=None, node: str = "node-1",
                 dra_versions=("v1.DRAPlugin", "v1beta1.DRAPlugin"),
                 health_versions=("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")):
        self.registry = Path(registry)
        self.api_server = api_server
        self.node = node
        self.dra_versions = dra_versions
        self.health_versions = health_versions
        self.plugins: dict[str, Plugin] = {}
        self.registrations: list = []          # (socket, PluginInfo, error or None)
        self.registered = threading.Condition()
        self._seen: dict[str, tuple] = {}
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> "TestKubelet":
        self.registry.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._seen.clear()
        if self.api_server is not None:
            self.api_server.delete_slices(self.node)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for p in self.plugins.values():
            p.close()
        self.plugins.clear()

    def restart(self, recreate: bool = True) -> None:
        self.stop()
        if recreate:
            shutil.rmtree(self.registry, ignore_errors=True)
        self.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                entries = list(os.scandir(self.registry))
            except OSError:
                entries = []
            for entry in entries:
                try:
                    st = os.stat(entry.path)
                except OSError:
                    continue
                # A socket made anew may get the inode number of the one it replaced (a plugin
                # killed -9 leaves its socket, the next one binds the name again): its change
                # time tells them apart, as the kubelet's watcher sees the new one's creation.
                ident = (st.st_dev, st.st_ino, st.st_ctime_ns)
                if self._seen.get(entry.path) != ident and entry.name.endswith(".sock"):
                    self._seen[entry.path] = ident
                    try:
                        self._register(entry.path)
                    except grpc.RpcError as e:         # a plugin going away mid-registration: not fatal
                        with self.registered:
                            self.registrations.append((entry.path, None, f"registration: {e.code().name}"))
            self._stop.wait(0.05)

    def _register(self, path: str) -> None:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
            except grpc.RpcError as e:
                self.registrations.append((path, None, f"GetInfo: {e.code().name}"))
                return
            error = None
            dra = next((v for v in info.supported_versions if v in self.dra_versions), None)
            if info.type != "DRAPlugin":
                error = f"type {info.type!r} is not DRAPlugin"
            elif not os.path.isabs(info.endpoint) or not os.path.exists(info.endpoint):
                error = f"endpoint {info.endpoint!r} is not an absolute path to a socket"
            elif dra is None:
                error = f"none of {list(info.supported_versions)} is supported"
            health = next((v for v in self.health_versions if v in info.supported_versions), None)
            stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
                plugin_registered=error is None, error=error or ""), timeout=5)
        with self.registered:
            self.registrations.append((path, info, error))
            if error is None:
                old = self.plugins.get(info.name)
                if old is not None:
                    old.close()
                self.plugins[info.name] = Plugin(info, len(self.registrations) - 1, dra, health)
            self.registered.notify_all()

    def plugin(self, name: str = "gpu.nvidia.com", after: int = 0, timeout: float = 15.0) -> Plugin:
        deadline = time.monotonic() + timeout
        with self.registered:
            while True:
                p = self.plugins.get(name)
                if p is not None and p.number >= after:
                    return p
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{name} did not register in {timeout} s: {self.registrations}")
                self.registered.wait(left)

    # ---- calls ----------------------------------------------------------------------

    def prepare(self, *claims, driver: str = "gpu.nvidia.com", timeout: float = 45.0) -> dict:
        """{claim uid: (devices as (requests, pool, device, cdi ids), error)}; ``claims``:
        (namespace, uid, name) or ResourceClaim objects."""
        p = self.plugins[driver]
        request = p.api.NodePrepareResourcesRequest(claims=[p.api.Claim(**_ref(c)) for c in claims])
        reply = p.stub.NodePrepareResources(request, timeout=timeout)
        return {uid: ([(tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))
                       for d in r.devices], r.error) for uid, r in reply.claims.items()}

    def unprepare(self, *claims, driver: str = "gpu.nvidia.com", timeout: float = 45.0) -> dict:
        p = self.plugins[driver]
        request = p.api.NodeUnprepareResourcesRequest(claims=[p.api.Claim(**_ref(c)) for c in claims])
        reply = p.stub.NodeUnprepareResources(request, timeout=timeout)
        return {uid: r.error for uid, r in reply.claims.items()}


def _ref(claim) -> dict:
    if isinstance(claim, dict):
        m = claim["metadata"]
        return {"namespace": m["namespace"], "uid": m["uid"], "name": m["name"]}
    namespace, uid, name = claim
    return {"namespace": namespace, "uid": uid, "name": name}
