"""The DRA plugin's errors: the Kubernetes API's (``KubeError``, from ``plugins.kubeerror``,
which everything catches without importing the Kubernetes client)."""

from __future__ import annotations

from ..kubeerror import KubeError

__all__ = ["KubeError"]
