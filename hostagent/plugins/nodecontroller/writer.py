"""Writes to the node's own Node: each a merge patch computed from the Node as last seen and
sent with its ``resourceVersion`` as a precondition, so a change made meanwhile by someone
else (a 409) is never overwritten: the Node is read again and the patch computed again.

The Node as last seen is the newest of the watch's, the API server's answers to this
writer's patches, and its reads after a 409 (no read before a write). The controller's
threads write through one writer, so an answer that comes back after a newer one (another
thread's patch, made later, answered first) never takes its place. A write that changes
nothing is not sent.
"""

from __future__ import annotations

import logging
import threading

from ..kubeerror import KubeError

__all__ = ["NodeWriter", "labels_patch", "merged"]

log = logging.getLogger("hostagent.plugins")

CONFLICT_TRIES = 5


def _metadata_patch(node: dict, field: str, wanted: dict) -> dict | None:
    have = (node.get("metadata") or {}).get(field) or {}
    change = {k: v for k, v in wanted.items() if have.get(k) != v}
    return {"metadata": {field: change}} if change else None


def labels_patch(node: dict, labels: dict) -> dict | None:
    """The patch giving ``node`` these labels (None: remove the key); None when it has them."""
    return _metadata_patch(node, "labels", labels)


def merged(*patches: dict | None) -> dict | None:
    """Merge patches as one (each changes keys of its own); None when all are None."""
    def merge(into: dict, patch: dict) -> dict:
        out = dict(into)
        for key, value in patch.items():
            out[key] = merge(out.get(key) or {}, value) if isinstance(value, dict) else value
        return out
    out = None
    for patch in patches:
        if patch is not None:
            out = merge(out or {}, patch)
    return out


def _older(node: dict, than: dict | None) -> bool:
    """Whether ``node`` is an older version than ``than``. resourceVersions are opaque to
    clients, but the API server's come from etcd's revision, an integer that only grows: a
    version that is not one is taken as newer."""
    if than is None:
        return False
    mine, theirs = node["metadata"].get("resourceVersion", ""), than["metadata"].get("resourceVersion", "")
    return mine.isdigit() and theirs.isdigit() and int(mine) < int(theirs)


class NodeWriter:
    def __init__(self, api, name: str):
        self.api = api
        self.name = name
        self.writes = 0
        self._node: dict | None = None
        self._lock = threading.Lock()

    def seen(self, node: dict | None) -> None:
        """A version of the Node (the watch's, an answer, a read): kept unless the one kept
        is newer (the watch may still be delivering changes made before it)."""
        if node is not None:
            with self._lock:
                if not _older(node, self._node):
                    self._node = node

    @property
    def node(self) -> dict | None:
        return self._node

    def update(self, change, what: str) -> dict | None:
        """Apply ``change(node) -> merge patch or None``; returns the Node after it (None
        when nothing needed changing). A 409 reads the Node and tries again."""
        node = self._node
        for attempt in range(CONFLICT_TRIES):
            if node is None:
                node = self.api.get_node(self.name)
                self.seen(node)
            patch = change(node)
            if patch is None:
                return None
            patch = {**patch, "metadata": {**(patch.get("metadata") or {}),
                                           "resourceVersion": node["metadata"]["resourceVersion"]}}
            try:
                result = self.api.patch_node(self.name, patch)
            except KubeError as e:
                if e.status != 409:
                    raise
                log.debug("%s: the Node changed meanwhile; reading it again", what)
                node = None
                continue
            self.writes += 1
            self.seen(result)
            return result
        raise KubeError(f"{what}: the Node kept changing ({CONFLICT_TRIES} conflicts in a row)", status=409)

    def set_labels(self, labels: dict, what: str = "labels") -> dict | None:
        return self.update(lambda node: labels_patch(node, labels), f"setting {what} on Node {self.name}")
