"""The Kubernetes API client's configuration and errors, shared by the plugins that talk to
the API server (the DRA plugin, the node controller), through lightkube.

The configuration is found as kubectl finds it for a node agent: ``--kubeconfig``, else
``$KUBECONFIG``, else the pod's service account. Client errors become ``KubeError`` (an API
status, or the server unreachable) at this edge. Imported only by the commands that talk
to the API server: the agent and the CLI never load the client.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
import yaml
from lightkube import ApiError, KubeConfig
from lightkube.core.exceptions import ConfigError

from ..errors import ConfigError as HostagentConfigError
from .kubeerror import KubeError

__all__ = ["KubeError", "load_config", "api_error", "FAILURES", "SERVICE_ACCOUNT"]

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# Hidden from a unit with ProtectHome=yes (systemd.exec(5)), as the plugins' units are.
PROTECTED_HOMES = ("/home/", "/root/", "/run/user/")


def _readable(path: str) -> None:
    """Refuse a kubeconfig this process may not read, saying why where the reason is known:
    the units' sandbox hides home folders."""
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        # Root refused a home folder's file: the sandbox, not the file's mode.
        hidden = os.geteuid() == 0 and os.path.abspath(path).startswith(PROTECTED_HOMES)
        raise HostagentConfigError(
            "cannot read the kubeconfig: Permission denied", where=path,
            hint="hostagent-dra-plugin.service and hostagent-node-controller.service run with ProtectHome=yes, "
                 "which hides /home, /root and /run/user from them: copy the kubeconfig elsewhere "
                 "(/etc/kubernetes/kubelet.conf, the kubelet's own, will do) and name it as KUBECONFIG in "
                 "/etc/hostagent/dra-plugin.env (or node-controller.env)" if hidden else
                 "make it readable by the plugin's user (the units run as root)") from None
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


def api_error(e: Exception, what: str) -> KubeError:
    if isinstance(e, ApiError):
        status = getattr(e.status, "code", None) or e.response.status_code
        message = getattr(e.status, "message", None) or str(e)
        return KubeError(f"{what}: {message}", status=status, reason=getattr(e.status, "reason", None))
    return KubeError(f"{what}: the API server is not reachable ({type(e).__name__}: {e})")


FAILURES = (ApiError, httpx2.HTTPError, OSError)
