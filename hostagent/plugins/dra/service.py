"""The DRA plugin's gRPC services on its one socket (``<plugin dir>/dra.sock``): DRAPlugin
v1 and v1beta1 (NodePrepareResources, NodeUnprepareResources) and DRAResourceHealth v1 and
v1alpha1 (NodeWatchResources).

The work is the handler's: ``prepare(claims)`` -> {claim uid: ``Prepared``} and
``unprepare(claims)`` -> {claim uid: error or None}. Every claim of a request gets an entry
(a claim left out would be asked for again); a handler that fails outright (a bug) is a gRPC
``INTERNAL``, never a crash of the server. The health streams send the board's full list at
once and again at every change or heartbeat.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from ..kubelet import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from ..kubelet import drahealth_v1_pb2, drahealth_v1_pb2_grpc, drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc
from .served import Served

__all__ = ["ClaimRef", "PreparedDevice", "Prepared", "DraServer", "SOCKET_NAME"]

log = logging.getLogger("hostagent.plugins")

SOCKET_NAME = "dra.sock"
MESSAGE_MAX = 1024            # a health message's limit; longer ones end in "..."


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]        # the claim's requests it serves (empty: all)
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class Prepared:
    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None


def _claims(request) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


class _DraPlugin:
    """One servicer body for both versions: ``api`` is the version's message module."""

    def __init__(self, handler, api, share_ids: bool):
        self.handler = handler
        self.api = api
        self.share_ids = share_ids

    def NodePrepareResources(self, request, context):
        claims = _claims(request)
        answers = self._call(context, self.handler.prepare, claims)
        response = self.api.NodePrepareResourcesResponse()
        for claim in claims:
            entry = response.claims[claim.uid]
            answer = answers.get(claim.uid) or Prepared(error="not prepared (no answer for it)")
            if answer.error:
                entry.error = answer.error
                continue
            for d in answer.devices:
                device = entry.devices.add(request_names=list(d.requests), pool_name=d.pool,
                                           device_name=d.device, cdi_device_ids=list(d.cdi_ids))
                if self.share_ids and d.share_id:
                    device.share_id = d.share_id
        return response

    def NodeUnprepareResources(self, request, context):
        claims = _claims(request)
        answers = self._call(context, self.handler.unprepare, claims)
        response = self.api.NodeUnprepareResourcesResponse()
        for claim in claims:
            error = answers.get(claim.uid, "not unprepared (no answer for it)")
            response.claims[claim.uid].error = error or ""
        return response

    @staticmethod
    def _call(context, fn, claims):
        try:
            return fn(claims)
        except Exception as e:          # a bug: the kubelet gets an error and retries
            log.exception("%s failed", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {e}")


class _DraPluginV1(_DraPlugin, dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, handler):
        super().__init__(handler, dra_v1_pb2, share_ids=True)


class _DraPluginV1beta1(_DraPlugin, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, handler):
        super().__init__(handler, dra_v1beta1_pb2, share_ids=False)


class _Health:
    def __init__(self, board, api):
        self.board = board
        self.api = api

    def NodeWatchResources(self, request, context):
        context.add_callback(self.board.wake)
        for entries in self.board.follow(context.is_active):
            now = int(time.time())
            yield self.api.NodeWatchResourcesResponse(devices=[self.api.DeviceHealth(
                device=self.api.DeviceIdentifier(pool_name=e.pool, device_name=e.device),
                health=self.api.HealthStatus.Value(e.status), last_updated_time=now,
                health_check_timeout_seconds=self.board.timeout,
                message=_cut(e.message or "")) for e in entries])


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."


class _HealthV1(_Health, drahealth_v1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, board):
        super().__init__(board, drahealth_v1_pb2)


class _HealthV1alpha1(_Health, drahealth_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, board):
        super().__init__(board, drahealth_v1alpha1_pb2)


class DraServer(Served):
    """The services on ``<plugin dir>/dra.sock``."""

    def __init__(self, plugin_dir: Path, handler, board, workers: int = 8):
        super().__init__(Path(plugin_dir) / SOCKET_NAME, workers, "dra")
        self.handler = handler
        self.board = board

    def add_services(self, server) -> None:
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DraPluginV1(self.handler), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_DraPluginV1beta1(self.handler), server)
        drahealth_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(_HealthV1(self.board), server)
        drahealth_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(_HealthV1alpha1(self.board), server)

    def start(self) -> None:
        super().start()
        log.info("serving the DRA plugin services on %s", self.socket)

    def stop(self, grace: float = 0.5) -> None:
        self.board.wake()
        super().stop(grace)
