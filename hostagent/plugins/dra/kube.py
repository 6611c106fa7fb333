"""The DRA plugin's Kubernetes API calls, through lightkube, with plain dicts in and out.

Its errors become ``KubeError`` at this edge, and its configuration is found as kubectl
finds it for a node agent (``plugins.kube``). Imported only by ``hostagent dra-plugin``:
the agent and the CLI never load the client.
"""

from __future__ import annotations

import httpx2
from lightkube import ApiError, Client, codecs
from lightkube.config.client_adapter import Client as HttpClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from ..kube import FAILURES as _FAILURES
from ..kube import SERVICE_ACCOUNT, KubeError, load_config
from ..kube import api_error as _error

__all__ = ["KubeError", "KubeApi", "load_config", "SERVICE_ACCOUNT"]


class KubeApi:
    def __init__(self, config, timeout: float = 10.0, field_manager: str = "hostagent-dra-plugin"):
        self.config = config
        self.timeout = timeout
        self.client = Client(config, timeout=httpx2.Timeout(timeout), field_manager=field_manager)

    def close(self) -> None:
        self.client.close()

    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the API server (``GET /version``)."""
        try:
            with HttpClient(self.config, ConnectionParams(timeout=httpx2.Timeout(self.timeout))) as http:
                response = http.get("/version")
                response.raise_for_status()
                data = response.json()
        except (httpx2.HTTPError, OSError) as e:
            raise _error(e, "reading the API server's version") from None
        try:
            return int(data["major"]), int("".join(c for c in data["minor"] if c.isdigit()))
        except (KeyError, TypeError, ValueError):
            raise KubeError(f"the API server's version is not readable: {data!r}") from None

    def node_uid(self, name: str) -> str | None:
        """The Node's uid (its slices' owner), None when it cannot be read."""
        try:
            return self.client.get(Node, name).metadata.uid
        except _FAILURES:
            return None

    def list_slices(self, driver: str, node: str) -> list[dict]:
        try:
            found = self.client.list(ResourceSlice, fields={"spec.driver": driver, "spec.nodeName": node})
            return [s.to_dict() for s in found]
        except _FAILURES as e:
            raise _error(e, "listing ResourceSlices") from None

    def create_slice(self, body: dict) -> dict:
        try:
            return self.client.create(codecs.from_dict(body)).to_dict()
        except _FAILURES as e:
            raise _error(e, f"creating ResourceSlice {body['metadata'].get('name')}") from None

    def replace_slice(self, body: dict) -> dict:
        try:
            return self.client.replace(codecs.from_dict(body)).to_dict()
        except _FAILURES as e:
            raise _error(e, f"updating ResourceSlice {body['metadata']['name']}") from None

    def delete_slice(self, name: str) -> None:
        try:
            self.client.delete(ResourceSlice, name)
        except ApiError as e:
            if e.status.code != 404:
                raise _error(e, f"deleting ResourceSlice {name}") from None
        except _FAILURES as e:
            raise _error(e, f"deleting ResourceSlice {name}") from None

    def watch_slices(self, driver: str, node: str, timeout: int = 300):
        """(event type, slice) as they come, for ``timeout`` seconds at most."""
        try:
            for kind, obj in self.client.watch(ResourceSlice, fields={"spec.driver": driver, "spec.nodeName": node},
                                               server_timeout=timeout):
                yield kind, obj.to_dict()
        except _FAILURES as e:
            raise _error(e, "watching ResourceSlices") from None

    def get_claim(self, namespace: str, name: str) -> dict:
        try:
            return self.client.get(ResourceClaim, name, namespace=namespace).to_dict()
        except _FAILURES as e:
            raise _error(e, f"reading ResourceClaim {namespace}/{name}") from None
