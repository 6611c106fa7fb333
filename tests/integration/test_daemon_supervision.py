"""The daemon's health monitor and metrics service never fail silently: a monitor or
sampler thread that ends is restarted (its devices unmonitored meanwhile), and a metrics
port someone else holds is retried while the socket's /metrics serves. In-process, with
the agent and the links the daemon uses, on a simulated node."""

import asyncio
import socket

from hostagent.daemon.agent import Agent
from hostagent.daemon.healthlink import HealthLink
from hostagent.daemon.metricslink import MetricsLink
from hostagent.daemon.settings import load_settings
from hostagent.health import HealthOptions
from hostagent.metrics import MetricsOptions
from tests.waiting import until


def states(agent) -> set[str]:
    return {d["health"]["state"] for d in agent.snapshot.devices.values()}


async def _agent(host):
    agent = Agent(host, load_settings(host))
    await agent.start()
    agent.health_link = HealthLink(agent, HealthOptions(wait_timeout_ms=100, state_file=False))
    return agent


def test_a_monitor_thread_that_ends_is_restarted(make_node):
    host, _ = make_node("t4x2")

    async def scenario():
        agent = await _agent(host)
        link = agent.health_link
        try:
            assert states(agent) == {"unmonitored"}            # nothing watches yet
            await link.start(agent.inventory)
            assert states(agent) == {"healthy"} and link.running
            first = link.monitor
            first._stop.set()                                  # its thread ends, as if it died
            first._thread.join(5)
            revision = agent.events.revision
            await link.check()
            assert link.monitor is not first and link.running
            assert states(agent) == {"healthy"}
            changes = [line for line in agent.events.after(revision) if b'"unmonitored"' in line]
            assert len(changes) == 2                           # both GPUs said unmonitored meanwhile
            await link.check()                                 # a running monitor is left alone
            assert link.monitor is not first and link.running
        finally:
            await link.stop()
            agent.close()
        assert not link.running
    asyncio.run(scenario())


def test_taken_metrics_port_is_retried_and_a_dead_sampler_restarted(make_node):
    host, _ = make_node("t4x2")
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]

    async def scenario():
        agent = await _agent(host)
        link = MetricsLink(agent, MetricsOptions(port=port, interval=1, hostname="n"), agent.health_link)
        try:
            await link.start(agent.inventory)                  # the port is taken: logged, not fatal
            assert link.server is None
            body, content_type = link.render()                 # the socket's /metrics still works
            assert b"DCGM_FI_DEV_GPU_TEMP{" in body and content_type.startswith("text/plain")
            blocker.close()
            await link.check()
            assert link.server is None                 # not before the retry is due
            link._next_bind = 0
            await link.check()
            assert link.port == port
            sampler = link.service.sampler
            sampler._stop.set()
            sampler._wake.set()
            sampler._thread.join(5)
            assert not sampler.running
            await link.check()
            assert sampler.running
        finally:
            await link.stop()
            agent.close()
    try:
        asyncio.run(scenario())
    finally:
        blocker.close()


def test_reload_turns_health_monitoring_off_and_on():
    """A changed health section restarts the monitor with it; off means unmonitored, not
    healthy, everywhere."""
    import signal

    from .agentd import AgentProcess, make_root
    agent = AgentProcess(make_root("t4x2"), {"daemon": {"resync_interval": 0}}).start()

    def wait_for(c, state):
        until(lambda: {g["health"]["state"] for g in c.devices()["gpus"]} == {state}, 15,
              lambda: c.devices()["gpus"][0]["health"], interval=0.1)
        return c.devices()["gpus"][0]["health"]

    try:
        with agent.client() as c:
            wait_for(c, "healthy")
            agent.write_config({"daemon": {"resync_interval": 0}, "health": {"enabled": False}})
            agent.signal(signal.SIGHUP)
            health = wait_for(c, "unmonitored")
            assert "health.enabled: false" in health["message"]
            assert c.health()["enabled"] is False and c.health()["devices"] == []
            assert "hostagent_device_healthy" not in c.metrics()
            agent.write_config({"daemon": {"resync_interval": 0}, "health": {"quiet_period": 0}})
            agent.signal(signal.SIGHUP)
            wait_for(c, "healthy")
            h = c.health()
            assert h["running"] and h["quiet_period"] is None
            until(lambda: "hostagent_device_healthy{" in c.metrics(), 10, "sampler following the new monitor",
                  interval=0.1)
        assert agent.proc.poll() is None
    finally:
        agent.stop()
        agent.cleanup()


def test_a_link_that_fails_to_start_is_started_at_the_next_check(make_node):
    from hostagent.daemon.features import Features
    host, _ = make_node("t4x2")

    host.config_file.parent.mkdir(parents=True, exist_ok=True)
    host.config_file.write_text("metrics: {port: null}\n")    # not dcgm-exporter's port

    async def scenario():
        agent = Agent(host, load_settings(host))
        await agent.start()
        features = Features(agent, lambda coroutine: asyncio.ensure_future(coroutine))
        features.make(agent.settings)
        link = agent.health_link
        real_start, calls = link.start, []

        async def failing_once(inventory):
            calls.append(inventory)
            if len(calls) == 1:
                raise RuntimeError("injected start failure")
            await real_start(inventory)
        link.start = failing_once
        try:
            await features.start()                              # logged; the metrics link still starts
            assert not link.started and agent.metrics_link.started and agent.metrics_link.port is None
            assert states(agent) == {"unmonitored"}
            await features.check()
            assert link.started and link.running and states(agent) == {"healthy"}
        finally:
            # Joined: a monitor thread outliving the test would shut down the NVML session
            # of the next test's simulated node in this process (exiting=True is for a
            # daemon whose process ends).
            await features.stop()
            agent.close()
        assert not link.running
    asyncio.run(scenario())
