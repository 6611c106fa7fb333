"""What the daemon hosts: the sampler, the exporter over it, pod attribution and the
optional TCP endpoint."""

from __future__ import annotations

from ..hostroot import HostRoot
from .exposition import CONTENT_TYPE, Exporter
from .labels import LabelHook, merged
from .options import MetricsOptions
from .sampler import MetricsSampler
from .server import MetricsServer

__all__ = ["MetricsService"]


class MetricsService:
    """``health_monitor``: a ``HealthMonitor`` (last XIDs, device health); ``device_labels``:
    extra labels per device UUID, e.g. ``labels.allocation_labels(store_lookup)``;
    ``agent``: the daemon's ``AgentMetrics`` (created here if not given); ``pod_resolver``:
    with ``options.kubernetes``, what gives the current ``pods.Resolver`` (default: the
    inventory's device UUIDs)."""

    content_type = CONTENT_TYPE

    def __init__(self, host: HostRoot, inventory, options: MetricsOptions | None = None, *,
                 health_monitor=None, device_labels: LabelHook | None = None, agent=None,
                 pod_resolver=None):
        from .agent import AgentMetrics
        self.options = options or MetricsOptions()
        self.host = host
        self.agent = agent if agent is not None else AgentMetrics()
        self.sampler = MetricsSampler(host, inventory, self.options.interval, agent=self.agent)
        self._inventory = inventory
        self.pods = None
        if self.options.kubernetes:
            from .pods import PodLabels
            self.pods = PodLabels(host.host(self.options.pod_resources_socket), self.options.interval,
                                  pod_resolver or self._inventory_resolver)
        health = (lambda: health_monitor.state) if health_monitor is not None else None
        self.exporter = Exporter(inventory, self.sampler, hostname=self.options.host_label, health=health,
                                 device_labels=merged(device_labels, self.pods and self.pods.labels),
                                 agent=self.agent)
        self.server = None

    def _inventory_resolver(self):
        from .pods import uuid_resolver
        inv = self._inventory
        return uuid_resolver({d.uuid: (d.uuid,) for d in (*inv.gpus, *inv.mig_devices)})

    def start(self) -> None:
        self.start_sampling()
        try:
            self.start_server()
        except BaseException:
            self.stop()
            raise

    def start_sampling(self) -> None:
        """The sampler (back after its first sample) and pod attribution, without the endpoint."""
        self.sampler.start()
        if self.pods is not None:
            self.pods.start()

    def start_server(self) -> None:
        """The TCP endpoint, if a port is set and it is not serving yet. Separate from
        ``start`` so the daemon can keep sampling (and serve the socket's /metrics) while a
        taken port is retried. Raises UnavailableError when the port cannot be bound."""
        if self.options.port is None or self.server is not None:
            return
        server = MetricsServer(self, self.options.address, self.options.port,
                               config_file=str(self.host.config_file))
        server.start()
        self.server = server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.pods is not None:
            self.pods.stop()
        self.sampler.stop()

    def update_inventory(self, inventory) -> None:
        self.exporter.update_inventory(inventory)
        self.sampler.update_inventory(inventory)
        self._inventory = inventory
        if self.pods is not None:
            self.pods.wake()

    def render(self) -> bytes:
        """The page for the API socket's ``GET /metrics`` (no NVML call)."""
        snapshot = self.sampler.snapshot
        self.agent.collectors(gpm=snapshot is not None and snapshot.gpm_complete,
                              kubernetes=None if self.pods is None else bool(self.pods.ok))
        return self.exporter.render()

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None
