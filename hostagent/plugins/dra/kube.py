"""The DRA plugin's Kubernetes API calls, through lightkube, with plain dicts in and out.

The one place that imports the client: its errors become ``KubeError`` (an API status, or
the server unreachable) at this edge, and its configuration is found as kubectl finds it
for a node agent: ``--kubeconfig``, else ``$KUBECONFIG``, else the pod's service account.
Imported only by ``hostagent dra-plugin``: the agent and the CLI never load the client.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
import yaml
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.config.client_adapter import Client as HttpClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.core.exceptions import ConfigError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from ...errors import ConfigError as HostagentConfigError
from .errors import KubeError

__all__ = ["KubeError", "KubeApi", "load_config", "SERVICE_ACCOUNT"]

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


# Hidden from a unit with ProtectHome=yes (systemd.exec(5)), such as hostagent-dra-plugin.service.
PROTECTED_HOMES = ("/home/", "/root/", "/run/user/")


def _readable(path: str) -> None:
    """Refuse a kubeconfig this process may not read, saying why where the reason is known:
    the unit's sandbox hides home folders."""
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        # Root refused a home folder's file: the sandbox, not the file's mode.
        hidden = os.geteuid() == 0 and os.path.abspath(path).startswith(PROTECTED_HOMES)
        raise HostagentConfigError(
            "cannot read the kubeconfig: Permission denied", where=path,
            hint="hostagent-dra-plugin.service runs with ProtectHome=yes, which hides /home, /root and "
                 "/run/user from it: copy the kubeconfig elsewhere (/etc/kubernetes/kubelet.conf, the kubelet's "
                 "own, will do) and name it as KUBECONFIG in /etc/hostagent/dra-plugin.env" if hidden else
                 "make it readable by the plugin's user (the unit runs as root)") from None
    except OSError:
        pass               # a missing file is said below


def load_config(kubeconfig: str | None = None, environ=os.environ):
    """The configuration of ``kubeconfig``, else ``$KUBECONFIG``'s first file, else the
    in-cluster service account; a ``ConfigError`` saying what to give when none works."""
    path = kubeconfig or next((p for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p), None)
    try:
        if path:
            _readable(path)
            if not Path(path).is_file():
                raise HostagentConfigError(f"no kubeconfig file {path}", where=path,
                                           hint="give --kubeconfig FILE or set KUBECONFIG to an existing file")
            config = KubeConfig.from_file(path).get()
            if config is None:
                raise HostagentConfigError(f"kubeconfig {path} has no current context", where=path,
                                           hint="set current-context in it (kubectl config use-context)")
            return config
        account = Path(SERVICE_ACCOUNT)
        if not (account / "token").is_file():
            raise HostagentConfigError("no Kubernetes configuration: no --kubeconfig, no KUBECONFIG, and no service "
                                       f"account token in {account} (not in a pod)",
                                       hint="give --kubeconfig FILE or set KUBECONFIG")
        return KubeConfig.from_service_account(account).get()
    except ConfigError as e:
        where = path or SERVICE_ACCOUNT
        raise HostagentConfigError(f"no usable Kubernetes configuration: {e}", where=where,
                                   hint="give --kubeconfig FILE, set KUBECONFIG, or run in a pod with a "
                                        "service account") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or e
        raise HostagentConfigError(f"kubeconfig {path} is not YAML: {problem}{at}", where=path,
                                   hint="give --kubeconfig a kubeconfig file, as kubectl config view --raw writes "
                                        "one") from None
    except (KeyError, TypeError, AttributeError) as e:
        # lightkube reads the document's keys without checking them first.
        what = f"no {e.args[0]!r}" if isinstance(e, KeyError) else "not a kubeconfig's shape"
        raise HostagentConfigError(f"kubeconfig {path or SERVICE_ACCOUNT} is not a kubeconfig: {what}",
                                   where=path or SERVICE_ACCOUNT,
                                   hint="it needs clusters, users, contexts and a current-context, as kubectl "
                                        "config view --raw writes them") from None
    except (OSError, ValueError) as e:
        raise HostagentConfigError(f"cannot read the Kubernetes configuration: {e}", where=path or "") from None


def _error(e: Exception, what: str) -> KubeError:
    if isinstance(e, ApiError):
        status = getattr(e.status, "code", None) or e.response.status_code
        message = getattr(e.status, "message", None) or str(e)
        return KubeError(f"{what}: {message}", status=status, reason=getattr(e.status, "reason", None))
    return KubeError(f"{what}: the API server is not reachable ({type(e).__name__}: {e})")


_FAILURES = (ApiError, httpx2.HTTPError, OSError)


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
