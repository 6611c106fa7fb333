"""One resource's device plugin: the kubelet's ``DevicePlugin`` service (v1beta1) on its own
UNIX socket in the device plugin directory.

The device list is set by the plugin manager (``update``); each ``ListAndWatch`` stream sends
the full list at once and again after every change. ``Allocate`` and
``GetPreferredAllocation`` are answered by the manager's ``handler`` (the agent does the
work); a ``PluginError`` becomes the gRPC status it names, any other failure ``INTERNAL``,
never a crash of the server.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from .kubelet import deviceplugin_pb2 as api
from .kubelet import deviceplugin_pb2_grpc as api_grpc
from .resources import PluginDevice

__all__ = ["ResourceServer", "PluginError", "socket_name", "socket_identity", "short", "some"]

log = logging.getLogger("hostagent.plugins")


MAX_MESSAGE = 400      # characters of an error the kubelet is sent (gRPC carries it in a header)


def short(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to ``limit`` characters, saying so."""
    return message if len(message) <= limit else message[:limit - 20].rstrip() + " ... (cut)"


def some(items, n: int = 3) -> str:
    """The first ``n`` of ``items``, and how many more: a message names a few, never all."""
    items = list(items)
    head = ", ".join(map(str, items[:n]))
    return head + (f" and {len(items) - n} more" if len(items) > n else "")


class PluginError(Exception):
    """An answer the kubelet gets as a gRPC error: ``code`` a ``grpc.StatusCode``; the message
    is kept short (a long one would reach the kubelet as RESOURCE_EXHAUSTED instead)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        message = short(message)
        super().__init__(message)
        self.code = code
        self.message = message


def socket_name(resource: str) -> str:
    """``nvidia.com/mig-1g.5gb`` -> ``hostagent-mig-1g.5gb.sock``."""
    return f"hostagent-{resource.rpartition('/')[2]}.sock"


def socket_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a socket file, None when it is gone: a file re-created by a
    restarted kubelet, or removed by one, shows as a different identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _to_api(d: PluginDevice) -> api.Device:
    topology = api.TopologyInfo(nodes=[api.NUMANode(ID=d.numa)]) if d.numa is not None else None
    return api.Device(ID=d.id, health=d.health, topology=topology)


class ResourceServer(api_grpc.DevicePluginServicer):
    def __init__(self, resource: str, plugin_dir: Path, handler):
        """``handler.allocate(resource, ids)`` -> ContainerAllocateResponse and
        ``handler.prefer(resource, available, must_include, size)`` -> ids."""
        self.resource = resource
        self.socket = Path(plugin_dir) / socket_name(resource)
        self.handler = handler
        self.devices: tuple[PluginDevice, ...] = ()
        self._version = 0
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._identity = None
        self._stopped = False
        self.registered = False

    # ---- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Serve on the socket (a stale file of the same name is replaced)."""
        self.socket.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"dp-{self.socket.stem}"))
        api_grpc.add_DevicePluginServicer_to_server(self, server)
        if not server.add_insecure_port(f"unix:{self.socket}"):
            raise OSError(f"cannot listen on {self.socket}")
        server.start()
        with self._cond:
            self._stopped = False
        self._server = server
        self._identity = socket_identity(self.socket)
        self.registered = False
        log.info("serving %s on %s", self.resource, self.socket)

    def stop(self, grace: float = 0.5) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        if self._identity is not None and socket_identity(self.socket) == self._identity:
            self.socket.unlink(missing_ok=True)    # ours, not a newer plugin's
        self._identity = None
        self.registered = False

    @property
    def socket_intact(self) -> bool:
        """False when the socket file was removed or replaced (a kubelet restart removes
        every plugin socket): serve again and register again."""
        return self._identity is not None and socket_identity(self.socket) == self._identity

    def update(self, devices) -> bool:
        """Set the device list; True when it changed (every stream then sends it)."""
        devices = tuple(devices)
        with self._cond:
            if devices == self.devices:
                return False
            self.devices = devices
            self._version += 1
            self._cond.notify_all()
        return True

    # ---- the DevicePlugin service ---------------------------------------------------------

    def GetDevicePluginOptions(self, request, context):
        return api.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context):
        wake = lambda: self._notify()       # noqa: E731 (the stream ended: stop waiting)
        context.add_callback(wake)
        sent = None
        while True:
            with self._cond:
                while sent == self._version and not self._stopped and context.is_active():
                    self._cond.wait(5.0)
                # A list not sent yet goes out even when stopping (a resource that went
                # away says so with an empty list first).
                if not context.is_active() or (self._stopped and sent == self._version):
                    return
                sent, devices = self._version, self.devices
            yield api.ListAndWatchResponse(devices=[_to_api(d) for d in devices])

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def GetPreferredAllocation(self, request, context):
        response = api.PreferredAllocationResponse()
        for req in request.container_requests:
            ids = self._answer(context, self.handler.prefer, self.resource, list(req.available_deviceIDs),
                               list(req.must_include_deviceIDs), req.allocation_size)
            response.container_responses.add(deviceIDs=ids)
        return response

    def Allocate(self, request, context):
        response = api.AllocateResponse()
        twice = _shared_ids([list(r.devices_ids) for r in request.container_requests])
        if twice:
            # The kubelet gives each container devices of its own: a device in two of one
            # request's containers would be given to both.
            message = f"{self.resource}: device(s) {some(twice)} asked for by more than one container of one request"
            log.warning("%s", message)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        for req in request.container_requests:
            response.container_responses.append(
                self._answer(context, self.handler.allocate, self.resource, list(req.devices_ids)))
        return response

    def PreStartContainer(self, request, context):
        return api.PreStartContainerResponse()

    def _answer(self, context, fn, *args):
        try:
            return fn(*args)
        except PluginError as e:
            log.warning("%s: %s", self.resource, e.message)
            context.abort(e.code, e.message)
        except Exception as e:          # a bug: the kubelet gets an error, the server lives on
            log.exception("%s: request failed", self.resource)
            context.abort(grpc.StatusCode.INTERNAL, short(f"internal error: {e}"))


def _shared_ids(requests: list[list[str]]) -> list[str]:
    """Device ids that more than one of the requests names, in the order first met."""
    seen, shared = set(), {}
    for ids in requests:
        for i in set(ids):
            if i in seen:
                shared[i] = None
            seen.add(i)
    return list(shared)
