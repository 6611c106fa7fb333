"""Pod attribution: which pod, namespace and container hold each device, from the kubelet's
pod resources API, as dcgm-exporter's ``--kubernetes`` mode labels its series (``pod``,
``namespace``, ``container``; for a device of a DRA claim also ``dra_claim_name``,
``dra_claim_namespace``, ``dra_driver_name``, ``dra_pool_name``, ``dra_device_name``, as its
``KUBERNETES_ENABLE_DRA`` adds them).

Pure: ``attribute`` (holdings -> labels per device UUID) and ``uuid_resolver``. Shell:
``PodLabels``, a thread that asks the kubelet once per interval and keeps the last answer,
so a scrape never waits for the kubelet; a socket that is missing, slow or failing leaves
the labels out, and ``ok`` (the ``kubernetes`` collector's success) says so.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Iterable, Mapping

__all__ = ["attribute", "uuid_resolver", "PodLabels", "Resolver"]

log = logging.getLogger("hostagent.metrics")

# A name the kubelet reports (device plugin id, CDI device name) -> the UUIDs it stands for
# (empty: not one of this node's devices).
Resolver = Callable[[str], tuple[str, ...]]


def uuid_resolver(table: Mapping[str, tuple[str, ...]]) -> Resolver:
    """Names in ``table``, plus a device plugin replica ``<id>::<n>`` of a name in it."""
    def resolve(name: str) -> tuple[str, ...]:
        found = table.get(name)
        if found is None and "::" in name:
            found = table.get(name.split("::", 1)[0])
        return found or ()
    return resolve


def attribute(holdings: Iterable, resolve: Resolver) -> dict[str, dict[str, str]]:
    """Device UUID -> its labels. Several holders of one device (shared replicas) give each
    label its distinct values comma-joined, as the ``allocation`` label does."""
    found: dict[str, dict[str, list[str]]] = {}

    def add(uuid: str, pairs) -> None:
        labels = found.setdefault(uuid, {})
        for key, value in pairs:
            values = labels.setdefault(key, [])
            if value not in values:
                values.append(value)

    for h in holdings:
        who = (("pod", h.pod), ("namespace", h.namespace), ("container", h.container))
        for ident in h.device_ids:
            uuids = resolve(ident)
            if not uuids:
                log.debug("pod %s/%s container %s holds %r, not a device of this node: ignored",
                          h.namespace, h.pod, h.container, ident)
            for uuid in uuids:
                add(uuid, who)
        for claim in h.claims:
            uuids = tuple(dict.fromkeys(u for name in claim.cdi_devices for u in resolve(name)))
            if not uuids:
                log.debug("pod %s/%s container %s: claim %s/%s device %s/%s/%s names no device of this node "
                          "(CDI %s): ignored", h.namespace, h.pod, h.container, claim.namespace, claim.name,
                          claim.driver, claim.pool, claim.device, ", ".join(claim.cdi_devices) or "none")
            dra = (("dra_claim_name", claim.name), ("dra_claim_namespace", claim.namespace),
                   ("dra_driver_name", claim.driver), ("dra_pool_name", claim.pool),
                   ("dra_device_name", claim.device))
            for uuid in uuids:
                add(uuid, who + dra)
    return {uuid: {k: ",".join(v) for k, v in labels.items()} for uuid, labels in found.items()}


class PodLabels:
    """The label hook of pod attribution: ``labels()`` is the last answer's, never waiting.
    ``resolver()`` gives the current Resolver (the daemon's follows its devices)."""

    def __init__(self, socket_path: str | os.PathLike, interval: float, resolver: Callable[[], Resolver], *,
                 timeout: float = 5.0):
        from ..plugins.podresources import PodResourcesClient
        self.client = PodResourcesClient(socket_path)
        self.interval = interval
        self.timeout = min(timeout, interval)
        self.resolver = resolver
        self.ok: bool | None = None          # None: not asked yet
        self.reason: str | None = None       # why the last List gave no labels
        self._labels: dict = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def labels(self) -> dict[str, dict[str, str]]:
        return self._labels

    def refresh(self) -> None:
        """Ask the kubelet once (the thread's turn; tests call it directly)."""
        from ..plugins.podresources import Unanswered
        try:
            holdings = self.client.list(self.timeout)
        except Unanswered as e:
            if self.ok is not False or self.reason != e.reason:
                log.warning("pod labels left out of the metrics: %s", e.reason)
            self._labels, self.ok, self.reason = {}, False, e.reason
            return
        self._labels = attribute(holdings, self.resolver())
        if self.ok is False:
            log.info("pod labels are back: the kubelet's pod resources API answers again")
        self.ok, self.reason = True, None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hostagent-pod-labels", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Ask again now (the devices changed)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                log.exception("pod attribution failed")
                self._labels, self.ok, self.reason = {}, False, "an internal error (logged)"
            self._wake.wait(self.interval)
            self._wake.clear()
