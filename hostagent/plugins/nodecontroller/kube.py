"""The node controller's Kubernetes API calls, through lightkube, with plain dicts in and out.

Every call names what it did in its ``KubeError`` (``status`` the HTTP status, None when the
API server did not answer). Patches are JSON merge patches, except a Node's status
(strategic: its conditions merge by type, as node-problem-detector sends them).
"""

from __future__ import annotations

import httpx2
from lightkube import ALL_NS, ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.types import PatchType

from ..kube import FAILURES, KubeError, api_error, load_config

__all__ = ["NodeApi", "KubeError", "load_config"]

# The server ends each watch request after this long; the watch is then resumed from the
# last resourceVersion seen (one request per this many seconds at rest).
WATCH_SECONDS = 300


def _gone(e: Exception) -> bool:
    return isinstance(e, ApiError) and getattr(e.status, "code", None) == 410


class NodeApi:
    def __init__(self, config, timeout: float = 10.0, field_manager: str = "hostagent-node-controller"):
        self.config = config
        self.client = Client(config, timeout=httpx2.Timeout(timeout), field_manager=field_manager)

    def close(self) -> None:
        self.client.close()

    def _call(self, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except FAILURES as e:
            raise api_error(e, what) from None

    # ---- Nodes ----------------------------------------------------------------------

    def get_node(self, name: str) -> dict:
        return self._call(f"reading Node {name}", self.client.get, Node, name).to_dict()

    def watch_node(self, name: str, resource_version: str | None, timeout: int = WATCH_SECONDS):
        """(event type, Node) as they come, from ``resource_version`` on; a 410 Gone (the
        version is too old) is a KubeError with status 410."""
        try:
            for kind, obj in self.client.watch(Node, fields={"metadata.name": name}, server_timeout=timeout,
                                               resource_version=resource_version):
                yield kind, obj.to_dict()
        except FAILURES as e:
            if _gone(e):
                raise KubeError(f"watching Node {name}: resourceVersion {resource_version} is too old",
                                status=410) from None
            raise api_error(e, f"watching Node {name}") from None

    def patch_node(self, name: str, patch: dict) -> dict:
        return self._call(f"patching Node {name}", self.client.patch, Node, name, patch,
                          patch_type=PatchType.MERGE).to_dict()

    def patch_node_status(self, name: str, patch: dict) -> dict:
        return self._call(f"patching the status of Node {name}", self.client.patch, Node.Status, name, patch,
                          patch_type=PatchType.STRATEGIC).to_dict()

    # ---- Events ---------------------------------------------------------------------

    def create_event(self, body: dict) -> dict:
        ns = body["metadata"]["namespace"]
        return self._call(f"creating an Event in {ns}", self.client.create, Event.from_dict(body),
                          namespace=ns).to_dict()

    def patch_event(self, namespace: str, name: str, patch: dict) -> dict:
        return self._call(f"updating Event {namespace}/{name}", self.client.patch, Event, name, patch,
                          namespace=namespace, patch_type=PatchType.MERGE).to_dict()

    # ---- Pods -----------------------------------------------------------------------

    def node_pods(self, node: str) -> list[dict]:
        """The pods bound to ``node``, in every namespace."""
        found = self._call(f"listing the pods of {node}", self.client.list, Pod, namespace=ALL_NS,
                           fields={"spec.nodeName": node})
        return self._call(f"listing the pods of {node}", lambda: [p.to_dict() for p in found])

    def evict(self, namespace: str, name: str) -> None:
        """POST a policy/v1 Eviction of the pod (429: a disruption budget forbids it now)."""
        body = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        self._call(f"evicting pod {namespace}/{name}", self.client.create, body, name=name, namespace=namespace)

    # ---- ConfigMaps -------------------------------------------------------------------

    def get_configmap(self, namespace: str, name: str) -> dict | None:
        """The ConfigMap, None when there is none."""
        try:
            return self.client.get(ConfigMap, name, namespace=namespace).to_dict()
        except ApiError as e:
            if getattr(e.status, "code", None) == 404:
                return None
            raise api_error(e, f"reading ConfigMap {namespace}/{name}") from None
        except FAILURES as e:
            raise api_error(e, f"reading ConfigMap {namespace}/{name}") from None

    def watch_configmaps(self, namespace: str, labels: dict | None = None, resource_version: str | None = None,
                         timeout: int = WATCH_SECONDS):
        """(event type, ConfigMap) of ``namespace`` (with ``labels``), as ``watch_node``."""
        try:
            for kind, obj in self.client.watch(ConfigMap, namespace=namespace, labels=labels,
                                               server_timeout=timeout, resource_version=resource_version):
                yield kind, obj.to_dict()
        except FAILURES as e:
            if _gone(e):
                raise KubeError(f"watching ConfigMaps in {namespace}: resourceVersion {resource_version} is too "
                                "old", status=410) from None
            raise api_error(e, f"watching ConfigMaps in {namespace}") from None
