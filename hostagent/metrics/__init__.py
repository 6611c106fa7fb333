"""Prometheus metrics under dcgm-exporter's names, sampled on one schedule for all scrapes.

Pure: ``families`` (names, types, sources), ``labels`` (label sets), ``render`` (text).
Shell: ``sampler`` (the NVML thread), ``exposition`` (the page), ``server`` (TCP endpoint),
``agent`` (hostagent's own collectors), ``pods`` (pod labels from the kubelet), ``service``
(all of it, as the daemon hosts it).
prometheus_client is imported only when its collectors are built.
"""

from .exposition import CONTENT_TYPE, Exporter
from .labels import allocation_labels
from .options import DEFAULT_PORT, MetricsOptions
from .sampler import MetricsSampler
from .server import MetricsServer
from .service import MetricsService

__all__ = ["MetricsService", "MetricsOptions", "MetricsSampler", "Exporter", "MetricsServer",
           "allocation_labels", "CONTENT_TYPE", "DEFAULT_PORT", "AgentMetrics"]


def __getattr__(name):
    if name == "AgentMetrics":          # prometheus_client only when someone asks
        from .agent import AgentMetrics
        return AgentMetrics
    raise AttributeError(name)
