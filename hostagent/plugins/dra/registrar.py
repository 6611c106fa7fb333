"""The plugin registration service, as the kubelet's plugin watcher expects it.

The kubelet watches its plugin registry folder (``/var/lib/kubelet/plugins_registry``) for
sockets; on a new one it calls ``GetInfo`` (who is there: type ``DRAPlugin``, the driver
name, the DRA service's socket and the gRPC services it serves), dials that endpoint, and
reports the outcome with ``NotifyRegistrationStatus``. A restarted kubelet finds the socket
again by itself; when the socket or its folder is removed (a kubelet whose registry folder
is re-created), ``intact`` turns false and the plugin serves it again, which registers again.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from ..kubelet import pluginregistration_pb2 as api
from ..kubelet import pluginregistration_pb2_grpc as api_grpc
from ..server import socket_identity

__all__ = ["Registrar", "PLUGIN_TYPE", "SERVICES"]

log = logging.getLogger("hostagent.plugins")

PLUGIN_TYPE = "DRAPlugin"
# What GetInfo says the plugin serves, as "<proto package's last part>.<service>": the kubelet
# takes the first DRAPlugin version it speaks (v1 from 1.34, v1beta1 before), and v1 of the
# health service where it has it (v1alpha1 on kubelets before v1 existed).
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


class _Servicer(api_grpc.RegistrationServicer):
    def __init__(self, registrar: "Registrar"):
        self.registrar = registrar

    def GetInfo(self, request, context):
        r = self.registrar
        with r.lock:
            r.asked += 1
        return api.PluginInfo(type=PLUGIN_TYPE, name=r.driver, endpoint=str(r.endpoint),
                              supported_versions=list(SERVICES))

    def NotifyRegistrationStatus(self, request, context):
        self.registrar.notified(request.plugin_registered, request.error)
        return api.RegistrationStatusResponse()


class Registrar:
    def __init__(self, registry_dir: Path, driver: str, endpoint: Path, on_registered=None):
        """``endpoint``: the DRA service's socket (absolute); ``on_registered()``: called on
        the gRPC thread each time the kubelet says it registered the plugin."""
        self.socket = Path(registry_dir) / f"{driver}-reg.sock"
        self.driver = driver
        self.endpoint = Path(endpoint).absolute()
        self.on_registered = on_registered
        self.lock = threading.Lock()
        self.asked = 0                   # GetInfo calls
        self.registered = False          # the kubelet's last word
        self.error: str | None = None    # why it did not register the plugin
        self._server: grpc.Server | None = None
        self._identity = None

    def start(self) -> None:
        """Serve on the socket (its folder made if missing; a stale file replaced)."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="dra-reg"))
        api_grpc.add_RegistrationServicer_to_server(_Servicer(self), server)
        if not server.add_insecure_port(f"unix:{self.socket}"):
            raise OSError(f"cannot listen on {self.socket}")
        server.start()
        self._server = server
        self._identity = socket_identity(self.socket)
        with self.lock:
            self.registered, self.error = False, None
        log.info("registration socket %s: driver %s, endpoint %s", self.socket, self.driver, self.endpoint)

    def stop(self, grace: float = 0.5) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        if self._identity is not None and socket_identity(self.socket) == self._identity:
            self.socket.unlink(missing_ok=True)
        self._identity = None

    def restart(self) -> None:
        self.stop(0)
        self.start()

    @property
    def intact(self) -> bool:
        """False when the socket file was removed or replaced: serve it again."""
        return self._identity is not None and socket_identity(self.socket) == self._identity

    def notified(self, registered: bool, error: str) -> None:
        with self.lock:
            self.registered, self.error = registered, (error or None) if not registered else None
        if registered:
            log.info("the kubelet registered driver %s", self.driver)
            if self.on_registered is not None:
                self.on_registered()
        else:
            log.error("the kubelet did not register driver %s: %s", self.driver, error or "no reason given")
