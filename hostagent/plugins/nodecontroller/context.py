"""What the node controller's parts share: its options, the API server's and the agent's
clients, the Node's writer, its cordon, the Event recorder and the evictor."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ...client import Client
from .cordon import Cordon
from .evict import Evictor

__all__ = ["Options", "Context"]

log = logging.getLogger("hostagent.plugins")


@dataclass(frozen=True)
class Options:
    node: str
    namespace: str
    agent_socket: Path
    mig_config: Path | None = None
    sharing_configs: Path | None = None
    default_sharing_config: str | None = None
    on_busy: str = "wait"
    taint_unhealthy: bool = False
    eviction_timeout: float = 300.0
    pod_resources: Path | None = None           # the kubelet's pod resources socket
    files_poll: float = 2.0                     # seconds between looks at the files (a local stat)
    backoff: tuple[float, float] = (0.5, 30.0)
    upgrade_lease: int = 60                     # seconds a driver upgrade's slot Lease lasts unrenewed
    install_poll: float = 0.2                   # seconds between questions to the agent while it installs


class Context:
    def __init__(self, options: Options, api, link, writer, recorder, stop: threading.Event):
        self.options = options
        self.api = api
        self.link = link
        self.writer = writer
        self.recorder = recorder
        self.stop = stop
        self.cordon = Cordon(writer)
        self.evictor = Evictor(api, timeout=options.eviction_timeout, stop=stop)

    def client(self) -> Client:
        """The agent, for quick calls (this thread's kept-alive connection)."""
        return self.link.client()

    def long_client(self) -> Client:
        """The agent, for an apply (a MIG apply resets GPUs: minutes, so no timeout)."""
        return Client(socket_path=self.options.agent_socket, timeout=None)

    def state(self, label: str, value: str) -> None:
        self.writer.set_labels({label: value}, label)

    def holdings(self):
        """What the kubelet says each container holds (None: not known)."""
        if self.options.pod_resources is None:
            return None
        from ..podresources import PodResourcesClient, Unanswered
        client = PodResourcesClient(self.options.pod_resources)
        try:
            return client.list(timeout=5.0)
        except Unanswered as e:
            log.warning("the pods holding the device plugin's allocations are not known: %s", e.reason)
            return None
        finally:
            client.close()
