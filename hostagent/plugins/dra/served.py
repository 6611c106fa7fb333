"""A gRPC server on a UNIX socket that knows whether its socket file is still its own: the
kubelet removes and re-creates its plugin folders, and a socket file gone (or replaced) is
served again."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from ..server import socket_identity

__all__ = ["Served"]

log = logging.getLogger("hostagent.plugins")


class Served:
    def __init__(self, socket: Path, workers: int, name: str):
        self.socket = Path(socket)
        self.workers = workers
        self.name = name
        self._server: grpc.Server | None = None
        self._identity = None

    def add_services(self, server: grpc.Server) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Serve on the socket (its folder made if missing; a stale file replaced)."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name))
        self.add_services(server)
        if not server.add_insecure_port(f"unix:{self.socket}"):
            raise OSError(f"cannot listen on {self.socket}")
        server.start()
        self._server = server
        self._identity = socket_identity(self.socket)

    def stop(self, grace: float = 0.5) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        if self._identity is not None and socket_identity(self.socket) == self._identity:
            self.socket.unlink(missing_ok=True)       # ours, not a newer instance's
        self._identity = None

    def restart(self) -> None:
        self.stop(0)
        self.start()

    @property
    def intact(self) -> bool:
        """False when the socket file was removed or replaced: serve it again."""
        return self._identity is not None and socket_identity(self.socket) == self._identity
