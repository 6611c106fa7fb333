"""One object of the API server followed by one watch: read once, then watched from its
resourceVersion, the watch resumed from the last version seen when it ends or breaks, and
read again only when the server says that version is gone (410). Never polled: at rest
the API server sees one watch request per ``WATCH_SECONDS``.

While the API server is away the last object read stays (``connected`` false), and the
follower tries again with back-off, catching up from where it was.
"""

from __future__ import annotations

import logging
import threading

from ..kubeerror import KubeError

__all__ = ["Follower", "NodeWatcher", "Collection", "FORBIDDEN_RETRY"]

log = logging.getLogger("hostagent.plugins")

# A watch the credentials do not allow (403: the kubelet's own on a host, for the driver
# upgrades' ConfigMap and Leases) is asked for again this rarely: as often as a watch is
# renewed, never a poll.
FORBIDDEN_RETRY = 300.0


class Follower:
    """``read()`` the object; ``watch(resource_version)`` its changes as (type, object).
    ``on_change(object or None)`` hears of each new version (None: deleted, or not there).
    ``absent_ok``: an object that does not exist is watched for (from no version: the API
    server then sends it as ADDED once it is made); else it is read again with back-off."""

    def __init__(self, what: str, read, watch, on_change, backoff: tuple[float, float] = (0.5, 30.0),
                 absent_ok: bool = False):
        self.what = what
        self.read = read
        self.watch = watch
        self.on_change = on_change
        self.backoff = backoff
        self.absent_ok = absent_ok
        self.current: dict | None = None
        self.connected = False
        self.error: str | None = "not read yet"
        self.version: str | None = None        # where the watch resumes (None: read first)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"watch {self.what}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _take(self, obj: dict | None) -> None:
        self.current = obj
        if obj is not None:
            self.version = obj["metadata"].get("resourceVersion") or self.version
        try:
            self.on_change(obj)
        except Exception:               # a listener's bug never stops the watch
            log.exception("the listener of %s failed", self.what)

    def _once(self) -> None:
        if self.version is None:
            try:
                obj = self.read()
            except KubeError as e:
                if e.status != 404:
                    raise
                obj = None
            self.connected, self.error = True, None
            self._take(obj)
            if obj is None and not self.absent_ok:
                raise KubeError(f"{self.what} does not exist", status=404)
        for kind, obj in self.watch(self.version):
            if self._stop.is_set():
                return
            if not self.connected:
                log.info("watching %s again", self.what)
            self.connected, self.error = True, None
            if kind == "DELETED":
                self.version = None
                self._take(None)
                return
            if kind in ("ADDED", "MODIFIED"):
                self._take(obj)

    def run(self) -> None:
        delay = self.backoff[0]
        while not self._stop.is_set():
            try:
                self._once()
                delay = self.backoff[0]
                continue
            except KubeError as e:
                if e.status == 410:
                    log.info("%s: the watch's version is gone; reading it again", self.what)
                    self.version = None
                    continue
                wait = FORBIDDEN_RETRY if e.status == 403 else delay
                if self.connected or self.error != e.message:
                    log.warning("%s (again in %g s%s)", e.message, wait,
                                "" if e.status == 403 else ", then backing off")
                self.connected, self.error = False, e.message
            self._stop.wait(wait)
            delay = min(delay * 2, self.backoff[1])


class NodeWatcher(Follower):
    """The node's own Node, watched with the field selector ``metadata.name``."""

    def __init__(self, api, name: str, on_change, backoff: tuple[float, float] = (0.5, 30.0)):
        super().__init__(f"Node {name}", lambda: api.get_node(name), lambda rv: api.watch_node(name, rv),
                         on_change, backoff)
        self.name = name


class Collection(Follower):
    """Objects of one kind followed as an informer does: listed (``read()`` -> (objects,
    the list's resourceVersion)), then watched from that version; ``items`` maps each name
    to the object as last seen, and ``on_change(items)`` hears of every change."""

    def __init__(self, what: str, read, watch, on_change, backoff: tuple[float, float] = (0.5, 30.0)):
        super().__init__(what, read, watch, on_change, backoff)
        self.items: dict[str, dict] = {}
        self.listed = False               # the list was read: ``items`` is complete

    def _publish(self) -> None:
        try:
            self.on_change(self.items)
        except Exception:               # a listener's bug never stops the watch
            log.exception("the listener of %s failed", self.what)

    def _once(self) -> None:
        if self.version is None:
            objects, self.version = self.read()
            self.items = {o["metadata"]["name"]: o for o in objects}
            self.listed, self.connected, self.error = True, True, None
            self._publish()
        for kind, obj in self.watch(self.version):
            if self._stop.is_set():
                return
            self.connected, self.error = True, None
            name = obj["metadata"]["name"]
            self.version = obj["metadata"].get("resourceVersion") or self.version
            if kind == "DELETED":
                self.items = {k: v for k, v in self.items.items() if k != name}
            elif kind in ("ADDED", "MODIFIED"):
                self.seen(obj)
            else:
                continue
            self._publish()

    def seen(self, obj: dict) -> None:
        """A version of an object: the watch's, or this process's own write as the API
        server answered it. Kept unless the one kept is newer: the watch may still be
        delivering changes made before that write (a Lease's holder would seem to change
        back)."""
        name = obj["metadata"]["name"]
        old = self.items.get(name)
        if old is None or _newer(obj, old):
            self.items = {**self.items, name: obj}


def _newer(obj: dict, than: dict) -> bool:
    mine, theirs = obj["metadata"].get("resourceVersion", ""), than["metadata"].get("resourceVersion", "")
    return not (mine.isdigit() and theirs.isdigit()) or int(mine) >= int(theirs)
