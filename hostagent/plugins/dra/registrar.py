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
from pathlib import Path

from ..kubelet import pluginregistration_pb2 as api
from ..kubelet import pluginregistration_pb2_grpc as api_grpc
from .served import Served

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


class Registrar(Served):
    def __init__(self, registry_dir: Path, driver: str, endpoint: Path, on_registered=None):
        """``endpoint``: the DRA service's socket (absolute); ``on_registered()``: called on
        the gRPC thread each time the kubelet says it registered the plugin."""
        super().__init__(Path(registry_dir) / f"{driver}-reg.sock", 2, "dra-reg")
        self.driver = driver
        self.endpoint = Path(endpoint).absolute()
        self.on_registered = on_registered
        self.lock = threading.Lock()
        self.asked = 0                   # GetInfo calls
        self.registered = False          # the kubelet's last word
        self.error: str | None = None    # why it did not register the plugin

    def add_services(self, server) -> None:
        api_grpc.add_RegistrationServicer_to_server(_Servicer(self), server)

    def start(self) -> None:
        super().start()
        with self.lock:
            self.registered, self.error = False, None
        log.info("registration socket %s: driver %s, endpoint %s", self.socket, self.driver, self.endpoint)

    def notified(self, registered: bool, error: str) -> None:
        with self.lock:
            self.registered, self.error = registered, (error or None) if not registered else None
        if registered:
            log.info("the kubelet registered driver %s", self.driver)
            if self.on_registered is not None:
                self.on_registered()
        else:
            log.error("the kubelet did not register driver %s: %s", self.driver, error or "no reason given")
