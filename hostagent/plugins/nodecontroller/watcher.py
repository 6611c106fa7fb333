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

__all__ = ["Follower", "NodeWatcher"]

log = logging.getLogger("hostagent.plugins")


class Follower:
    """``read()`` the object; ``watch(resource_version)`` its changes as (type, object).
    ``on_change(object or None)`` hears of each new version (None: deleted, or not there)."""

    def __init__(self, what: str, read, watch, on_change, backoff: tuple[float, float] = (0.5, 30.0)):
        self.what = what
        self.read = read
        self.watch = watch
        self.on_change = on_change
        self.backoff = backoff
        self.current: dict | None = None
        self.connected = False
        self.error: str | None = "not read yet"
        self.version: str | None = None        # where the watch resumes (None: read first)
        self.reads = 0                         # full reads: the first, and after each 410
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
            self.reads += 1
            try:
                obj = self.read()
            except KubeError as e:
                if e.status != 404:
                    raise
                obj = None
            self.connected, self.error = True, None
            self._take(obj)
            if obj is None:
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
                if self.connected or self.error != e.message:
                    log.warning("%s (again in %g s, then backing off)", e.message, delay)
                self.connected, self.error = False, e.message
            self._stop.wait(delay)
            delay = min(delay * 2, self.backoff[1])


class NodeWatcher(Follower):
    """The node's own Node, watched with the field selector ``metadata.name``."""

    def __init__(self, api, name: str, on_change, backoff: tuple[float, float] = (0.5, 30.0)):
        super().__init__(f"Node {name}", lambda: api.get_node(name), lambda rv: api.watch_node(name, rv),
                         on_change, backoff)
        self.name = name
