"""What the daemon hosts: the sampler, the exporter over it, and the optional TCP endpoint."""

from __future__ import annotations

from ..hostroot import HostRoot
from .exposition import CONTENT_TYPE, Exporter
from .labels import LabelHook
from .options import MetricsOptions
from .sampler import MetricsSampler
from .server import MetricsServer

__all__ = ["MetricsService"]


class MetricsService:
    """``health_monitor``: a ``HealthMonitor`` (last XIDs, device health); ``device_labels``:
    extra labels per device UUID, e.g. ``labels.allocation_labels(store_lookup)``;
    ``agent``: the daemon's ``AgentMetrics`` (created here if not given)."""

    content_type = CONTENT_TYPE

    def __init__(self, host: HostRoot, inventory, options: MetricsOptions | None = None, *,
                 health_monitor=None, device_labels: LabelHook | None = None, agent=None):
        from .agent import AgentMetrics
        self.options = options or MetricsOptions()
        self.agent = agent if agent is not None else AgentMetrics()
        self.sampler = MetricsSampler(host, inventory, self.options.interval, agent=self.agent)
        health = (lambda: health_monitor.state) if health_monitor is not None else None
        self.exporter = Exporter(inventory, self.sampler, hostname=self.options.host_label,
                                 health=health, device_labels=device_labels, agent=self.agent)
        self.server = None

    def start(self) -> None:
        self.sampler.start()
        try:
            self.start_server()
        except BaseException:
            self.sampler.stop()
            raise

    def start_server(self) -> None:
        """The TCP endpoint, if a port is set and it is not serving yet. Separate from
        ``start`` so the daemon can keep sampling (and serve the socket's /metrics) while a
        taken port is retried. Raises UnavailableError when the port cannot be bound."""
        if self.options.port is None or self.server is not None:
            return
        server = MetricsServer(self.exporter, self.options.address, self.options.port)
        server.start()
        self.server = server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.sampler.stop()

    def update_inventory(self, inventory) -> None:
        self.exporter.update_inventory(inventory)
        self.sampler.update_inventory(inventory)

    def render(self) -> bytes:
        """The page for the API socket's ``GET /metrics`` (no NVML call)."""
        return self.exporter.render()

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None
