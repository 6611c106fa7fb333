"""What the node controller's parts share: its options, the API server's and the agent's
clients, the Node's writer, the Event recorder, and the clearing of devices in use
(``--on-busy evict``: cordon, evict the pods holding them, uncordon only its own cordon)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ...client import Client
from ...errors import HostagentError
from .cordon import Cordon
from .events import NORMAL, WARNING
from .evict import Evictor, Refused
from .holders import holders

__all__ = ["Options", "Context", "Clearing"]

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


class Clearing:
    """Devices in use cleared for one feature (``why``: the label it serves): the node
    cordoned, the pods holding them evicted, then, once the agent's allocations are gone and
    the change made (or given up), the cordon lifted if it was this feature's."""

    def __init__(self, ctx: Context, why: str):
        self.ctx = ctx
        self.why = why
        self.deadline: float | None = None

    @property
    def active(self) -> bool:
        return self.deadline is not None

    def overdue(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def start(self, busy, what: str) -> str | None:
        """Cordon and evict for ``busy`` (the agent's ``{id, labels, devices}``); the problem
        when some pod cannot be evicted or some allocation has no pod, else None."""
        ctx = self.ctx
        self.deadline = time.monotonic() + ctx.options.eviction_timeout
        if ctx.cordon.cordon(self.why):
            ctx.recorder.record(NORMAL, "Cordoned", f"node cordoned for {what}")
        found = holders(list(busy), ctx.api.node_pods(ctx.options.node), ctx.holdings())
        if found.unheld:
            return (f"no pod holds allocation(s) {', '.join(found.unheld)} (release them: hostagent allocations "
                    "release ID)")
        try:
            ctx.evictor.evict(found.pods)
        except Refused as e:
            return e.message
        if found.pods:
            ctx.recorder.record(NORMAL, "Evicted", f"evicted for {what}: "
                                + ", ".join(f"{ns}/{name}" for ns, name in found.pods))
        return None

    def finish(self) -> None:
        """Lift this feature's cordon (never another's)."""
        self.deadline = None
        try:
            if self.ctx.cordon.uncordon(self.why):
                self.ctx.recorder.record(NORMAL, "Uncordoned", f"node uncordoned after {self.why}")
        except HostagentError as e:
            log.warning("the node's cordon for %s was not lifted: %s", self.why, e.message)
            self.ctx.recorder.record(WARNING, "UncordonFailed", f"the cordon for {self.why} was not lifted: "
                                                                f"{e.message}")
