"""Settings of the metrics endpoint: the ``metrics:`` section of the config file."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

__all__ = ["MetricsOptions", "DEFAULT_PORT"]

DEFAULT_PORT = 9400          # dcgm-exporter's, so existing scrape configs find it
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class MetricsOptions:
    enabled: bool = True
    address: str = "127.0.0.1"       # loopback: expose wider only on purpose
    port: int | None = DEFAULT_PORT  # None: no TCP listener (the socket's /metrics only)
    interval: float = 10.0           # seconds between NVML samples
    hostname: str | None = None      # the Hostname label; default $NODE_NAME, else the host name
    kubernetes: bool = False         # pod, namespace and container labels from the kubelet
    pod_resources_socket: str = POD_RESOURCES_SOCKET   # a host path

    @classmethod
    def from_config(cls, section: dict | None) -> "MetricsOptions":
        section = dict(section or {})
        return cls(**{k: v for k, v in section.items() if v is not None or k in ("port", "hostname")})

    @property
    def host_label(self) -> str:
        return self.hostname or os.environ.get("NODE_NAME") or socket.gethostname()
