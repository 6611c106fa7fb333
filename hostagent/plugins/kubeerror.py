"""The one error of the plugins that talk to the Kubernetes API (``plugins.kube`` raises it;
everything else catches it without importing the Kubernetes client)."""

from __future__ import annotations

from ..errors import HostagentError

__all__ = ["KubeError"]


class KubeError(HostagentError):
    """A Kubernetes API call failed: ``status`` the HTTP status (None: no answer)."""
    code = "kubernetes_api_error"

    def __init__(self, message: str, status: int | None = None, reason: str | None = None, **kw):
        super().__init__(message, **kw)
        self.status = status
        self.reason = reason

    @property
    def unreachable(self) -> bool:
        return self.status is None
