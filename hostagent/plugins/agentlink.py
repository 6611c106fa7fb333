"""A kubelet plugin's link to the agent: the node's devices as the agent's watch stream keeps
them, and an API client per thread for the calls a plugin makes (allocate, release, prefer).

Shared by every kubelet-side consumer (the device plugin; a DRA kubelet plugin next): none
reads NVML, all of them follow ``GET /v1/watch``. The link takes the snapshot, applies each
event, and hands every changed ``NodeView`` to its listeners. When the agent goes away (its
``stopping`` line, a broken stream, silence past three heartbeats) the view says
``connected=False`` at once, and the link reconnects with back-off, resuming with
``since=`` the last revision it saw (the agent answers with the missed events, or a fresh
snapshot when they are gone).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field, replace

from ..client import Client
from ..errors import HostagentError, UnavailableError

__all__ = ["NodeView", "AgentLink"]

log = logging.getLogger("hostagent.plugins")


@dataclass(frozen=True)
class NodeView:
    """What the agent said last. Replaced, never changed, so readers need no lock."""
    connected: bool = False
    revision: int | None = None
    devices: dict = field(default_factory=dict)        # uuid -> device view (GET /v1/devices/{id})
    labels: dict = field(default_factory=dict)         # the node's GFD labels (GET /v1/labels)
    node: dict = field(default_factory=dict)           # the node (GET /v1/node): driver versions and gate
    error: str | None = None                           # why it is not connected


def _apply(view: NodeView, event: dict) -> NodeView:
    """The view after one watch event (the same view when the event changes nothing it holds)."""
    kind = event.get("type")
    if kind == "snapshot":
        devices = {d["uuid"]: d for d in (*event.get("gpus", ()), *event.get("mig_devices", ()))}
        return replace(view, devices=devices, node=event.get("node") or view.node)
    if kind in ("device_added", "device_changed"):
        d = event["device"]
        return replace(view, devices={**view.devices, d["uuid"]: d})
    if kind == "device_removed":
        devices = dict(view.devices)
        devices.pop(event["device"]["uuid"], None)
        return replace(view, devices=devices)
    if kind == "labels_changed":
        return replace(view, labels=event["labels"])
    if kind == "node_changed":
        return replace(view, node=event["node"])
    return view


# The events a view changes with (_apply); the allocations' are left to the agent to send
# to those who want them: each carries the allocation's container edits.
WATCHED = ("device_added", "device_changed", "device_removed", "labels_changed", "node_changed")


class AgentLink:
    def __init__(self, socket_path: str | os.PathLike, timeout: float = 10.0,
                 backoff: tuple[float, float] = (0.2, 5.0)):
        self.socket_path = os.fspath(socket_path)
        self.timeout = timeout
        self.backoff = backoff
        self.view = NodeView(error="not connected yet")
        self.listeners: list = []           # called with each new NodeView, on the link's thread
        # Whether an allocation id is one the link's user made (it knows of those already).
        self.owned = lambda alloc_id: False
        # The id prefix of those, when they have one: the agent then leaves out the device
        # changes only in them (``?own=``), so the devices' allocations lists may lack them.
        self.own_prefix: str | None = None
        self.connects = 0                   # successful (re)connections, for tests and status
        self.types = WATCHED                # the event types asked for (a user may want more)
        self.event_listeners: list = []     # called with each event as it comes, on the link's thread
        self._local = threading.local()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- calls ----------------------------------------------------------------------

    def client(self) -> Client:
        """This thread's client (a client's kept-alive connection is not shared by threads)."""
        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = Client(socket_path=self.socket_path, timeout=self.timeout)
        return c

    # ---- following the agent ----------------------------------------------------------

    def start(self) -> None:
        # A daemon thread: a stream read may block until the next heartbeat, and stopping
        # the process must not wait for it.
        self._thread = threading.Thread(target=self.run, name="agent-link", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _take(self, view: NodeView, event: dict) -> None:
        """One event of the stream applied to ``view`` (the current one, or a new connection's,
        whose change the listeners always hear of)."""
        quiet = view is self.view and self._own_bookkeeping(view, event)
        view = replace(_apply(view, event), revision=event.get("revision", view.revision))
        self._publish(view, notify=not quiet)

    def _own_bookkeeping(self, view: NodeView, event: dict) -> bool:
        """A device change only in its list of allocations, by allocations the link's user
        made: the view keeps it, the listeners are not woken (each allocation makes one)."""
        if event.get("type") != "device_changed" or not event.get("changed") \
                or set(event["changed"]) != {"allocations"}:
            return False
        new = event["device"]
        old = view.devices.get(new.get("uuid")) or {}
        moved = set(new.get("allocations") or ()) ^ set(old.get("allocations") or ())
        return all(self.owned(a) for a in moved)

    def _publish(self, view: NodeView, notify: bool = True) -> None:
        """Make ``view`` current; tell the listeners (unless ``notify`` is false) when more
        than its revision changed."""
        last, self.view = self.view, view
        if not notify or replace(view, revision=last.revision) == last:
            return
        for listener in list(self.listeners):
            try:
                listener(view)
            except Exception:           # one listener's bug never stops the link
                log.exception("agent view listener %r failed", listener)

    def _follow(self) -> str:
        """One connection: labels, then the watch stream until it ends (why) or breaks."""
        with Client(socket_path=self.socket_path, timeout=self.timeout) as c:
            try:
                labels = c.labels().get("labels") or {}
            except UnavailableError as e:
                if getattr(e, "status", None) != 503:
                    raise
                labels = {}                 # the agent has not read the inventory yet
            first = True
            for event in c.watch(since=self.view.revision, types=self.types, own=self.own_prefix):
                if self._stop.is_set():
                    return "stopped"
                view = self.view
                if first:
                    self.connects += 1
                    log.info("following the agent on %s from revision %s", self.socket_path,
                             event.get("revision"))
                    view = replace(view, connected=True, error=None, labels=labels)
                    first = False
                self._take(view, event)
                for listener in list(self.event_listeners):
                    try:
                        listener(event)
                    except Exception:   # one listener's bug never stops the link
                        log.exception("agent event listener %r failed", listener)
                if event.get("type") == "stopping":
                    return "the agent is stopping"
        return "the agent's stream ended"

    def run(self) -> None:
        delay = self.backoff[0]
        while not self._stop.is_set():
            connects = self.connects
            try:
                error = self._follow()
            except HostagentError as e:
                error = e.message
            except (OSError, ValueError) as e:       # a broken socket, a garbled line
                error = f"the agent's stream broke: {e}"
            if self._stop.is_set():
                return
            if self.view.connected or self.view.error != error:
                log.warning("lost the agent (%s); reconnecting", error)
            self._publish(replace(self.view, connected=False, error=error))
            if self.connects != connects:
                delay = self.backoff[0]
            self._stop.wait(delay)
            delay = min(delay * 2, self.backoff[1])
