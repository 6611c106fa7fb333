"""The metrics service inside the daemon: the sampler, the loopback TCP endpoint and the
page the API socket's ``GET /metrics`` serves.

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


class MetricsLink:
    def __init__(self, agent, options, health):
        self.agent = agent
        self.options = options               # MetricsOptions
        self.health = health                 # anything with .state (the HealthLink)
        self.service = None
        self._bind_error: str | None = None
        self._next_bind = 0.0

    @property
    def enabled(self) -> bool:
        return self.options.enabled

    @property
    def started(self) -> bool:
        return self.service is not None

    @property
    def port(self) -> int | None:
        return self.service.port if self.service is not None else None

    def _allocations(self) -> dict:
        """Scrape threads: device UUID -> allocation ids, from the current snapshot."""
        return {uuid: v["allocations"] for uuid, v in self.agent.snapshot.devices.items() if v["allocations"]}

    async def start(self, inventory) -> None:
        from ..metrics import MetricsService, allocation_labels
        if not self.enabled or inventory is None or self.service is not None:
            return
        service = MetricsService(self.agent.host, inventory, self.options,
                                 health_monitor=self.health if self.health.enabled else None,
                                 device_labels=allocation_labels(self._allocations),
                                 agent=self.agent.metrics)
        self.service = service
        await asyncio.to_thread(service.sampler.start)       # the first sample, off the loop
        await self._bind()

    async def _bind(self) -> None:
        service = self.service
        if service is None or self.options.port is None or service.server is not None:
            return
        try:
            await asyncio.to_thread(service.start_server)
        except UnavailableError as e:
            if self._bind_error != e.message:
                log.error("metrics endpoint not served (retrying every %gs; the socket's /metrics "
                          "works): %s", _BIND_RETRY, e.message)
            self._bind_error = e.message
            self._next_bind = time.monotonic() + _BIND_RETRY
            return
        if self._bind_error:
            log.info("metrics endpoint serving on %s:%d", self.options.address, service.port)
        else:
            log.info("metrics on http://%s:%d/metrics", self.options.address, service.port)
        self._bind_error = None

    async def stop(self) -> None:
        service, self.service = self.service, None
        if service is not None:
            await asyncio.to_thread(service.stop)

    async def check(self) -> None:
        """Restart a sampler that ended without being stopped; retry a taken port."""
        service = self.service
        if service is None:
            return
        if not service.sampler.running:
            log.error("the metrics sampler stopped unexpectedly; restarting it")
            await asyncio.to_thread(service.sampler.stop, 1.0)
            await asyncio.to_thread(service.sampler.start)
        if service.server is None and self.options.port is not None and time.monotonic() >= self._next_bind:
            await self._bind()

    def inventory_changed(self, inventory) -> None:
        if self.service is not None:
            self.service.update_inventory(inventory)

    def render(self) -> tuple[bytes, str]:
        """The page for the socket's ``GET /metrics`` and its content type."""
        service = self.service
        if service is None and self.agent.driver.maintenance is not None:
            # A driver install runs and the sampler let go of NVML: the agent's own metrics
            # (hostagent_driver_ready 0 among them) are what there is to see.
            from ..metrics.exposition import CONTENT_TYPE
            return self.agent.metrics.render(), CONTENT_TYPE
        if service is None:
            raise UnavailableError("metrics are disabled (metrics.enabled: false)" if not self.enabled
                                   else "metrics are not available yet (no inventory)")
        return service.render(), service.content_type
