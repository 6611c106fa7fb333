"""The daemon's health monitor and metrics service as one lifecycle: made from the settings,
started after the start-up reconcile (or with the first readable inventory), fed every
changed inventory, checked periodically, restarted when their settings change on reload,
paused while a GPU leaves the nvidia driver or comes back to it (``let_go``), stopped at
SIGTERM.

Both keep an NVML session open, and NVML keeps open the device node of every GPU it
attached until the process's last ``nvmlShutdown`` (nvml.h; the nvidia driver counts each
open in the GPU's ``usage_count``, nv.c). The driver refuses the unbind lock of a GPU whose
count is not zero (nv-procfs.c), so while they run no GPU could be passed through; and
NVML's indices and handles change when a GPU leaves or comes back (nvml.h,
``nvmlDeviceRemoveGpu_v2``). So around such a move both stop, the process's NVML shuts
down, and they start again on the inventory read after it.

Never fatal: a link that fails to start or whose thread ends is logged and tried again at
the next check; the daemon serves on (devices unmonitored meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os

__all__ = ["Features", "CHECK_PERIOD"]

log = logging.getLogger("hostagent.daemon")

CHECK_PERIOD = 5.0          # seconds between checks of the monitor's and sampler's threads


class Features:
    def __init__(self, agent, spawn):
        self.agent = agent
        self._spawn = spawn              # runs a coroutine as a daemon task
        self.paused = 0                  # moves under way that need NVML let go (let_go)

    @property
    def links(self) -> tuple:
        return (self.agent.health_link, self.agent.metrics_link)

    def make(self, settings) -> None:
        """The links for ``settings`` (not started); devices' default health follows."""
        from ..health import HealthOptions
        from ..metrics import MetricsOptions
        from .health import Health, unmonitored
        from .healthlink import HealthLink
        from .metricslink import MetricsLink
        sections = settings.sections
        # No state file nor request files: the API serves health and takes clears.
        options = dataclasses.replace(HealthOptions.from_config(sections.get("health"), os.environ),
                                      state_file=False)
        agent = self.agent
        agent.health_link = HealthLink(agent, options)
        agent.metrics_link = MetricsLink(agent, MetricsOptions.from_config(sections.get("metrics")),
                                         agent.health_link)
        if options.enabled:
            agent.default_health = unmonitored(agent.started)
        else:
            agent.default_health = Health("unmonitored", "unmonitored",
                                          "health monitoring is disabled (health.enabled: false)",
                                          agent.started, monitored=False)
            agent.health = {}

    @property
    def _held(self) -> bool:
        """The links stay stopped: a driver install runs, or a GPU is moving (let_go)."""
        return self.agent.driver.maintenance is not None or self.paused > 0

    async def start(self) -> None:
        if self.paused:
            return                 # let_go starts them when the move is over
        inventory = self.agent.inventory
        for link in self.links:
            try:
                await link.start(inventory)
            except Exception:
                log.exception("%s did not start; retrying at the next check", type(link).__name__)

    async def stop(self, exiting: bool = False) -> None:
        """``exiting``: the process ends next, so the monitor's NVML wait is not waited out."""
        for link in reversed(self.links):
            try:
                await (link.stop(0.1) if exiting and link is self.agent.health_link else link.stop())
            except Exception:
                log.exception("%s did not stop cleanly", type(link).__name__)

    @contextlib.asynccontextmanager
    async def let_go(self, why: str):
        """For the block, the daemon holds no GPU open: the monitor and the sampler stopped
        (the metrics page is still served, the health carried over), so the process's NVML
        is shut down between the worker's own sessions. Afterwards they start again on the
        agent's inventory (re-read in the block by whoever moved a GPU)."""
        self.paused += 1
        try:
            stopped = [link for link in reversed(self.links) if link.started]
            for link in stopped:
                try:
                    await (link.stop(endpoint=False) if link is self.agent.metrics_link else link.stop())
                except Exception:
                    log.exception("%s did not stop to let go of the GPUs", type(link).__name__)
            if stopped:
                log.info("health monitor and metrics sampler paused: %s", why)
            yield
        finally:
            self.paused -= 1
            if not self._held:
                await self.check()

    def inventory_changed(self, inventory) -> None:
        """Agent listener (loop thread): follow a changed inventory; start what waited for
        the first readable one."""
        if self._held:
            return                 # a driver install or a GPU's move: the links stay stopped
        waiting = False
        for link in self.links:
            if link.started:
                link.inventory_changed(inventory)
            elif link.enabled:
                waiting = True
        if waiting:
            self._spawn(self.start())

    async def check(self) -> None:
        if self._held:
            return                 # a driver install or a GPU's move: the links stay stopped
        for link in self.links:
            try:
                if link.enabled and not link.started and self.agent.inventory is not None:
                    await link.start(self.agent.inventory)
                else:
                    await link.check()
            except Exception:
                log.exception("%s check failed", type(link).__name__)

    async def supervise(self, period: float = CHECK_PERIOD) -> None:
        while True:
            await asyncio.sleep(period)
            await self.check()

    async def reload(self, old, new) -> None:
        """A changed health or metrics section restarts both (metrics reads health). Health
        carries over to the new monitor, re-evaluated under the new settings."""
        if all(old.sections.get(k) == new.sections.get(k) for k in ("health", "metrics")):
            return
        log.info("health or metrics settings changed: restarting the monitor and the sampler")
        previous = self.agent.health_link
        await self.stop()
        self.make(new)
        self.agent.health_link.carried = previous.carried
        self.agent.publish()
        await self.start()
