"""The metrics service inside the daemon: the sampler, the loopback TCP endpoint and the
page the API socket's ``GET /metrics`` serves.

The page is always served, whatever NVML says: without an inventory (the driver not
loaded at start), while a driver install holds the sampler, or when a sample fails, it
carries hostagent's own metrics (``hostagent_driver_ready``, the driver checks, the API
counters) and ``hostagent_scrape_collector_success`` says which parts could not be read,
as node-exporter's gauge of the same name does. So the endpoint binds at start, before the
sampler, which starts with the first readable inventory.

Never fatal: a port someone else holds is logged and retried (the socket's /metrics works
meanwhile), and a sampler thread that ended is restarted by ``check()``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..errors import UnavailableError

__all__ = ["MetricsLink"]

log = logging.getLogger("hostagent.daemon")

_BIND_RETRY = 30.0          # seconds between attempts at a taken port


class _Page:
    """What the TCP endpoint renders: the link's page."""

    def __init__(self, link):
        self.link = link

    def render(self) -> bytes:
        return self.link.render()[0]


class MetricsLink:
    def __init__(self, agent, options, health):
        self.agent = agent
        self.options = options               # MetricsOptions
        self.health = health                 # anything with .state (the HealthLink)
        self.service = None                  # the sampler and its exporter, once there is an inventory
        self.server = None                   # the TCP endpoint
        self._bind_error: str | None = None
        self._next_bind = 0.0
        self._names = None                   # (snapshot, its pod resolver)

    @property
    def enabled(self) -> bool:
        return self.options.enabled

    @property
    def started(self) -> bool:
        """The sampler runs (the endpoint may serve without it)."""
        return self.service is not None

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None

    def _allocations(self) -> dict:
        """Scrape threads: device UUID -> allocation ids, from the current snapshot."""
        return {uuid: v["allocations"] for uuid, v in self.agent.snapshot.devices.items() if v["allocations"]}

    def _pod_resolver(self):
        """Pod attribution's thread: the names the kubelet may report for this node's devices
        (device plugin ids, CDI names of the node's spec and of allocations) -> UUIDs."""
        from ..metrics.pods import uuid_resolver
        snapshot = self.agent.snapshot
        if self._names is None or self._names[0] is not snapshot:
            table: dict[str, tuple[str, ...]] = {}
            for uuid, view in snapshot.devices.items():
                for name in (uuid, *view.get("replicas", ()), *view.get("cdi_devices", ())):
                    table[name] = (uuid,)
            for alloc in snapshot.allocations.values():
                if len(alloc.cdi_devices) == len(alloc.devices):     # one CDI device per device, in order
                    table.update((name, (uuid,)) for name, uuid in zip(alloc.cdi_devices, alloc.devices))
                else:
                    table.update((name, tuple(alloc.devices)) for name in alloc.cdi_devices)
            self._names = (snapshot, uuid_resolver(table))
        return self._names[1]

    async def start(self, inventory) -> None:
        """The endpoint at once; the sampler when there is an inventory."""
        from ..metrics import MetricsService, allocation_labels
        if not self.enabled:
            return
        await self._bind()
        if inventory is None or self.service is not None:
            return
        service = MetricsService(self.agent.host, inventory, self.options,
                                 health_monitor=self.health if self.health.enabled else None,
                                 device_labels=allocation_labels(self._allocations),
                                 agent=self.agent.metrics, pod_resolver=self._pod_resolver)
        self.service = service
        await asyncio.to_thread(service.start_sampling)      # the first sample, off the loop

    async def _bind(self) -> None:
        from ..metrics import MetricsServer
        if self.options.port is None or self.server is not None:
            return
        server = MetricsServer(_Page(self), self.options.address, self.options.port,
                               config_file=str(self.agent.host.config_file))
        try:
            await asyncio.to_thread(server.start)
        except UnavailableError as e:
            if self._bind_error != e.message:
                log.error("metrics endpoint not served (retrying every %gs; the socket's /metrics "
                          "works): %s", _BIND_RETRY, e.message)
            self._bind_error = e.message
            self._next_bind = time.monotonic() + _BIND_RETRY
            return
        self.server = server
        if self._bind_error:
            log.info("metrics endpoint serving on %s:%d", self.options.address, server.port)
        else:
            log.info("metrics on http://%s:%d/metrics", self.options.address, server.port)
        self._bind_error = None

    async def stop(self, *, endpoint: bool = True) -> None:
        """Stop the sampler (it lets go of NVML) and, unless ``endpoint`` is False (a driver
        install: the page keeps being served), the endpoint."""
        service, self.service = self.service, None
        if service is not None:
            await asyncio.to_thread(service.stop)
        server = self.server if endpoint else None
        if server is not None:
            self.server = None
            await asyncio.to_thread(server.stop)

    async def check(self) -> None:
        """Restart a sampler that ended without being stopped; retry a taken port."""
        service = self.service
        if service is not None and not service.sampler.running:
            log.error("the metrics sampler stopped unexpectedly; restarting it")
            await asyncio.to_thread(service.sampler.stop, 1.0)
            await asyncio.to_thread(service.sampler.start)
        if self.enabled and self.server is None and self.options.port is not None \
                and time.monotonic() >= self._next_bind:
            await self._bind()

    def inventory_changed(self, inventory) -> None:
        if self.service is not None:
            self.service.update_inventory(inventory)

    def render(self) -> tuple[bytes, str]:
        """The page for the socket's ``GET /metrics`` (and the endpoint) and its content type."""
        from ..metrics.exposition import CONTENT_TYPE
        if not self.enabled:
            raise UnavailableError("metrics are disabled (metrics.enabled: false)")
        agent, service = self.agent, self.service
        sampled = service is not None and service.sampler.snapshot is not None
        agent.metrics.collectors(inventory=agent.inventory is not None and agent.inventory_error is None,
                                 gpu=sampled)
        if service is None:             # nothing sampled, nobody asked the kubelet
            agent.metrics.collectors(gpm=False, kubernetes=False if self.options.kubernetes else None)
            return agent.metrics.render(), CONTENT_TYPE
        return service.render(), service.content_type
