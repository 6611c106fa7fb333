"""Health, metrics and labels through the real daemon on a simulated DGX A100: faults
injected with ``hostagent sim`` in other processes while the daemon runs, observed through
its API (watch stream, devices, allocations, /v1/health, /metrics) and its files.

One daemon for the module (start-up and the MIG apply cost seconds): GPU 0 is split into
seven 1g.5gb, GPU 1 into two 3g.20gb, one allocation holds a MIG device of GPU 0. The
test that loses a GPU (and reboots the node to get it back) has a node of its own.
"""

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostagent.errors import UsageError
from hostagent.health.monitor import LOST_RETRY
from hostagent.labels import FEATURES_FILE
from hostagent.labels import parse as parse_labels
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import AgentProcess, make_root


CLI = [sys.executable, "-m", "hostagent.cli.main"]
QUIET = 4.0            # long enough to observe 'unhealthy' on a busy box, short to wait out
LAYOUT = {"version": "v1", "mig-configs": {"t": [
    {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
    {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
    {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": False}]}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def labels_file(agent) -> dict:
    return parse_labels(agent.host.host(FEATURES_FILE).read_text())


class Node:
    def __init__(self, agent):
        self.agent = agent
        self.port = None
        self.labels_at_start = None
        self.gpus = self.migs = None

    def cli(self, *args, check=True):
        return subprocess.run(CLI + ["--simulate", str(self.agent.root), *map(str, args)], check=check,
                              capture_output=True, text=True, timeout=60)

    def sim(self, *args):
        self.cli("sim", *args)

    def client(self):
        return self.agent.client()


# Its node has MIG devices (root's to make): each test on it is marked GPU_CHANGES.
@contextlib.contextmanager
def health_node():
    port = free_port()
    agent = AgentProcess(make_root(), {
        "api": {"watch_heartbeat": 2}, "daemon": {"resync_interval": 0},
        "health": {"quiet_period": QUIET, "wait_timeout_ms": 200},
        "metrics": {"port": port, "interval": 1, "hostname": "node-1"},
        "labels": {"mig_strategy": "mixed"}}).start()
    n = Node(agent)
    n.port = port
    try:
        n.labels_at_start = labels_file(agent)
        with agent.client() as c:
            c.request("POST", "/v1/mig/apply", {"config": "t", "spec": LAYOUT})
            mig0 = [m for m in c.devices(type="mig")["mig_devices"] if m["parent_index"] == 0]
            c.allocate("claim-a", [mig0[0]["name"]])
            devices = c.devices()
            n.gpus = devices["gpus"]
            n.migs = devices["mig_devices"]
        yield n
        assert agent.proc.poll() is None, agent.log()
    finally:
        agent.stop()
        agent.cleanup()


@pytest.fixture(scope="module")
def node():
    with health_node() as n:
        yield n


@pytest.fixture
def own_node():
    """A node of its own, for a test that leaves it changed for good."""
    with health_node() as n:
        yield n


class Watch:
    """A watch stream from now on: events collected until a condition holds."""

    def __init__(self, client):
        self.stream = client.watch()
        self.snapshot = next(self.stream)
        assert self.snapshot["type"] == "snapshot"
        self.events = []

    def until(self, done, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not done(self.events):
            assert time.monotonic() < deadline, f"timed out; got {[e['type'] for e in self.events]}"
            event = next(self.stream)
            if event["type"] != "heartbeat":
                self.events.append(event)
        return self.events

    def close(self):
        self.stream.close()


def changed(events, state=None):
    """uuid -> the last device_changed view (with health ``state`` if given)."""
    return {e["device"]["uuid"]: e["device"] for e in events
            if e["type"] == "device_changed" and (state is None or e["device"]["health"]["state"] == state)}


def health_events(events, **match):
    return [e for e in events if e["type"] == "health_event"
            and all(e["event"].get(k) == v for k, v in match.items())]


@GPU_CHANGES
def test_labels_at_start_and_after_a_mig_change(node):
    start = node.labels_at_start
    assert start["nvidia.com/gpu.count"] == "8" and start["nvidia.com/mig.strategy"] == "mixed"
    assert not any(k.startswith("nvidia.com/mig-") for k in start)
    now = labels_file(node.agent)
    assert now["nvidia.com/gpu.count"] == "8"                   # every A100, split or not (as GFD)
    assert now["nvidia.com/mig-1g.5gb.count"] == "7" and now["nvidia.com/mig-3g.20gb.count"] == "2"
    assert now["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    # gfd.timestamp: when the labels last changed (the file is rewritten only then)
    assert int(now["nvidia.com/gfd.timestamp"]) >= int(start["nvidia.com/gfd.timestamp"])
    path = node.agent.host.host(FEATURES_FILE)
    written = path.stat()
    with node.client() as c:
        c.refresh()                                             # labels unchanged: not rewritten
        assert labels_file(node.agent) == now
        after = path.stat()
        assert (after.st_ino, after.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
        served = c.labels()
    assert served["labels"] == now and served["file"]["error"] is None
    assert served["file"]["path"].endswith(FEATURES_FILE)


@GPU_CHANGES
def test_gpu_wide_xid_marks_the_gpu_its_mig_devices_and_the_allocation_then_recovers(node):
    gpu0 = node.gpus[0]
    mig0 = {m["uuid"] for m in node.migs if m["parent_index"] == 0}
    alloc_dev = next(m["uuid"] for m in node.migs if m["allocations"] == ["claim-a"])
    with node.client() as c:
        w = Watch(c)
        node.sim("xid", "--gpu", 0, "--xid", 48)
        events = w.until(lambda ev: len(changed(ev, "unhealthy")) == 8)
        (he,) = health_events(events, kind="xid", xid=48)
        assert he["event"]["ignored"] is False and he["event"]["gi"] is None
        assert set(he["event"]["devices"]) == {gpu0["uuid"], *mig0}
        assert he["event"]["allocations"] == ["claim-a"]
        # revisions: one per event, consecutive, the device views carry their event's
        revisions = [e["revision"] for e in events]
        assert revisions == list(range(revisions[0], revisions[0] + len(revisions)))
        assert all(e["device"]["revision"] == e["revision"] for e in events if e["type"] == "device_changed")
        bad = changed(events, "unhealthy")
        assert set(bad) == {gpu0["uuid"], *mig0}                # GPU 1 and the rest untouched
        assert all(v["health"]["reason"] == "xid" and "XID 48" in v["health"]["message"] and
                   not v["allocatable"] for v in bad.values())
        # read back while still unhealthy (QUIET seconds)
        alloc = c.allocation("claim-a")
        assert alloc["unhealthy_devices"] == [alloc_dev]
        assert c.device("0")["health"]["state"] == "unhealthy"
        with pytest.raises(Exception) as refused:
            c.allocate("claim-x", [sorted(mig0 - {alloc_dev})[0]])
        assert getattr(refused.value, "code", None) == "device_not_allocatable"
        seen = len(events)
        w.until(lambda ev: len(changed(ev[seen:], "healthy")) == 8, timeout=QUIET + 10)   # quiet: recovered
        w.close()
    with node.client() as c:
        assert "unhealthy_devices" not in c.allocation("claim-a")
        health = {d["key"]: d for d in c.health()["devices"]}
    assert health[gpu0["uuid"]]["state"] == "healthy" and health[gpu0["uuid"]]["last_xid"] == 48


@GPU_CHANGES
def test_scoped_xid_marks_only_that_mig_device_and_clear(node):
    target = next(m for m in node.migs if m["parent_index"] == 0 and not m["allocations"])
    with node.client() as c:
        w = Watch(c)
        node.sim("xid", "--gpu", 0, "--xid", 94, "--gi", target["gi"], "--ci", target["ci"])
        events = w.until(lambda ev: changed(ev, "unhealthy"))
        w.close()
        (he,) = health_events(events, xid=94)
        assert (he["event"]["gi"], he["event"]["ci"]) == (target["gi"], target["ci"])
        assert he["event"]["devices"] == [target["uuid"]] and he["event"]["allocations"] == []
        assert list(changed(events, "unhealthy")) == [target["uuid"]]
        bad = [d["uuid"] for d in (*c.devices()["gpus"], *c.devices()["mig_devices"])
               if d["health"]["state"] == "unhealthy"]
        assert bad == [target["uuid"]]
        assert c.device(target["uuid"])["health"]["message"].startswith("XID 94 (instance)")
        with pytest.raises(UsageError) as unknown:
            c.clear_health(["9:9"])
        assert unknown.value.code == "unknown_device" and unknown.value.status == 422
        cleared = c.clear_health([target["name"]])
        assert cleared["cleared"] == [target["name"]]
        assert c.get("/v1/node")["revision"] >= cleared["revision"]
        assert c.device(target["uuid"])["health"]["state"] == "healthy"
        for bad_body in ({}, {"all": False}, {"devices": []}, {"devices": ["0"], "all": True}):
            with pytest.raises(UsageError):
                c.request("POST", "/v1/health/clear", bad_body)


@GPU_CHANGES
def test_ignored_xid_is_recorded_not_unhealthy(node):
    gpu1 = node.gpus[1]
    with node.client() as c:
        w = Watch(c)
        node.sim("xid", "--gpu", 1, "--xid", 13)
        events = w.until(lambda ev: health_events(ev) and changed(ev))
        w.close()
        (he,) = health_events(events)
        assert he["event"]["ignored"] is True and he["event"]["xid"] == 13
        assert changed(events, "unhealthy") == {}
        assert "last XID 13" in changed(events)[gpu1["uuid"]]["health"]["message"]
        devices = c.devices()
        assert all(d["health"]["state"] == "healthy" for d in (*devices["gpus"], *devices["mig_devices"]))
        record = next(d for d in c.health()["devices"] if d["key"] == gpu1["uuid"])
        assert record["last_xid"] == 13 and record["healthy"] and record["reasons"] == []


def parse(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams, name, **labels):
    return [s for s in fams[name].samples if all(s.labels.get(k) == v for k, v in labels.items())]


@GPU_CHANGES
def test_metrics_on_the_socket_and_the_tcp_port(node):
    gpu0 = node.gpus[0]
    alloc_gi = next(str(m["gi"]) for m in node.migs if m["allocations"] == ["claim-a"])
    with node.client() as c:
        w = Watch(c)
        node.sim("xid", "--gpu", 2, "--xid", 31)                # ignored: recorded as the last XID
        w.until(lambda ev: health_events(ev))
        w.close()
        c.device("0")                                           # counted: GET /v1/devices/{device} 200
        response = c.request("GET", "/metrics")
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        first = parse(response.body.decode())
    with urllib.request.urlopen(f"http://127.0.0.1:{node.port}/metrics", timeout=10) as r:
        tcp = parse(r.read().decode())
    for fams in (first, tcp):
        (temp,) = samples(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="3")
        assert temp.labels == {"gpu": "3", "UUID": node.gpus[3]["uuid"], "pci_bus_id": node.gpus[3]["pci_bus_id"],
                               "device": "nvidia3", "modelName": "NVIDIA A100-SXM4-40GB",
                               "Hostname": "node-1", "DCGM_FI_DRIVER_VERSION": "550.90.07"}
        mig = samples(fams, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_PROFILE="1g.5gb")
        assert len(mig) == 7 and {s.labels["UUID"] for s in mig} == {gpu0["uuid"]}
        (held,) = [s for s in mig if s.labels["GPU_I_ID"] == alloc_gi]
        assert held.labels["allocation"] == "claim-a"
        assert {s.labels["name"] for s in samples(fams, "hostagent_device_healthy")} >= {"0", "0:0", "1"}
        assert samples(fams, "DCGM_FI_DEV_XID_ERRORS", gpu="2")[0].value == 31
    # hostagent's own counters
    assert samples(first, "hostagent_api_requests", method="GET", route="/v1/devices/{device}", code="200")
    assert samples(first, "hostagent_mig_applies")[0].value == 1
    assert samples(first, "hostagent_health_events", kind="xid", ignored="true")[0].value >= 1
    assert samples(first, "hostagent_cdi_refreshes", result="written")[0].value >= 2   # start, apply
    # values move: the energy counter grows between samples (interval 1 s)
    energy = samples(first, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="5")[0].value

    def sampled_again():
        with node.client() as c:
            fams = parse(c.metrics())
        return fams if samples(fams, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="5")[0].value > energy else None
    later = until(sampled_again, 10, "new sample", interval=0.5)
    assert samples(later, "hostagent_metrics_samples")[0].value > samples(first, "hostagent_metrics_samples")[0].value


@GPU_CHANGES
def test_devices_command_shows_health(node):
    with node.client() as c:
        w = Watch(c)
        node.sim("ecc", "--gpu", 3)                              # a double-bit ECC error
        events = w.until(lambda ev: changed(ev, "unhealthy"))
        w.close()
    (he,) = health_events(events)
    assert he["event"]["kind"] == "ecc_dbe" and he["event"]["devices"] == [node.gpus[3]["uuid"]]
    out = node.cli("devices").stdout                           # within QUIET seconds
    assert out.splitlines()[0].split()[-1] == "HEALTH"
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if re.match(r"\s*\d", line)}
    assert rows["3"] == "unhealthy" and rows["2"] == "healthy"
    assert {rows[m["name"]] for m in node.migs} == {"healthy"}  # MIG devices have their own rows
    data = json.loads(node.cli("devices", "-o", "json").stdout)
    assert data["gpus"][3]["health"]["state"] == "unhealthy" and data["gpus"][3]["health"]["reason"] == "ecc_dbe"
    assert {d["health"]["state"] for d in data["mig_devices"] if d["parent_index"] == 0} == {"healthy"}
    with node.client() as c:                                   # leave the node healthy for others
        c.clear_health(["3"])
        assert c.device("3")["health"]["state"] == "healthy"


@GPU_CHANGES
def test_lost_gpu_marks_its_devices_until_cleared(own_node):
    node = own_node
    gpu1 = node.gpus[1]
    mig1 = {m["uuid"] for m in node.migs if m["parent_index"] == 1}
    with node.client() as c:
        w = Watch(c)
        node.sim("lose", "--gpu", 1)
        events = w.until(lambda ev: [v["health"]["reason"] for v in changed(ev).values()] == ["gpu_lost"] * 3)
        w.close()
    assert [e["event"]["xid"] for e in health_events(events)] == [79, None]    # XID 79, then gpu_lost
    assert set(changed(events, "unhealthy")) == {gpu1["uuid"], *mig1}
    # read locally, the GPU is unreadable now; the daemon still knows its health
    out = node.cli("devices").stdout
    assert "GPU 1: unreadable: GPU is lost; health: unhealthy" in out
    status = node.cli("health", "status").stdout
    assert re.search(r"^1\s+GPU-\S+\s+unhealthy\s+XID 79, gpu lost\s.*\s-$", status, re.M)   # never recovers
    with node.client() as c:
        assert c.device("1")["health"]["message"].endswith("; until cleared")
        for _ in range(2):                                     # later inventory reads: unreadable GPU 1
            c.refresh()
            assert c.node()["unreadable_gpus"] == 1
        records = {d["key"]: d for d in c.health()["devices"]}
        assert not any(k.startswith("gpu:") for k in records)  # still known by its UUID
        record = records[gpu1["uuid"]]
        assert record["recover_at"] is None and [r["sticky"] for r in record["reasons"]] == [False, True]
        assert record["lost"] and not record["monitored"]
        assert {records[u]["state"] for u in mig1} == {"unhealthy"}
        healthy = samples(parse(c.metrics()), "hostagent_device_healthy", UUID=gpu1["uuid"])
        assert [s.value for s in healthy] == [0] and not samples(parse(c.metrics()), "hostagent_device_healthy",
                                                                 UUID="gpu:1")
    assert node.cli("health", "clear", "1").stdout.startswith("cleared: 1, ")
    with node.client() as c:
        record = next(d for d in c.health()["devices"] if d["key"] == gpu1["uuid"])
        assert record["healthy"] and not record["monitored"]   # nothing watches a lost GPU
        assert record["state"] == "unmonitored"
        node.sim("reboot")                                     # GPU 1 readable again: watched again
        record = until(lambda: next((d for d in c.health()["devices"] if d["key"] == gpu1["uuid"] and d["monitored"]), None),
                       LOST_RETRY + 10, lambda: c.health()["devices"], interval=0.2)
        assert record["state"] == "healthy" and not record["lost"]
        w = Watch(c)
        node.sim("xid", "--gpu", 1, "--xid", 48)
        events = w.until(lambda ev: health_events(ev, gpu=1, xid=48))
        w.close()
    assert health_events(events, gpu=1, xid=48)[0]["event"]["gpu_uuid"] == gpu1["uuid"]


def test_health_carries_over_a_reload():
    """A reload that changes the health or metrics section replaces the monitor: health and
    last XIDs carry over (no quiet period skipped, 'until cleared' kept), re-evaluated under
    the new XID lists."""
    import signal

    from .agentd import make_root as make
    config = {"daemon": {"resync_interval": 0}, "health": {"quiet_period": 0, "wait_timeout_ms": 200},
              "metrics": {"port": None, "interval": 1}}
    agent = AgentProcess(make("t4x2"), config).start()

    def reload(c, **health):
        before = c.health()["policy"]
        agent.write_config(dict(config, health=dict(config["health"], **health)))
        agent.signal(signal.SIGHUP)
        until(lambda: c.health()["policy"] != before and c.health()["running"], 15, lambda: agent.log(), interval=0.1)
        return {d["name"]: d for d in c.health()["devices"]}

    try:
        with agent.client() as c:
            w = Watch(c)
            node = Node(agent)
            node.sim("xid", "--gpu", 0, "--xid", 48)
            node.sim("xid", "--gpu", 1, "--xid", 31)           # ignored: only the last XID
            w.until(lambda ev: len(health_events(ev)) == 2)
            w.close()
            records = reload(c, enable_xids=[31])              # 31 counts from now on
            assert records["0"]["state"] == "unhealthy" and records["0"]["last_xid"] == 48
            assert records["1"]["state"] == "healthy" and records["1"]["last_xid"] == 31
            xids = {s.labels["gpu"]: s.value for s in samples(parse(c.metrics()), "DCGM_FI_DEV_XID_ERRORS")}
            assert xids == {"0": 48, "1": 31}
            records = reload(c, disable_xids=[48])             # 48 no longer makes a GPU unhealthy
            assert records["0"]["state"] == "healthy" and records["0"]["last_xid"] == 48
            assert c.device("0")["health"]["state"] == "healthy"
        assert agent.proc.poll() is None
    finally:
        agent.stop()
        agent.cleanup()


def test_a_restarted_monitor_keeps_health(make_node):
    """In process: a monitor thread that ends is restarted by the link's check, from the
    health it had (an XID with quiet_period 0 waits for a clear, not for a restart)."""
    import asyncio

    from hostagent.daemon.agent import Agent
    from hostagent.daemon.healthlink import HealthLink
    from hostagent.daemon.settings import load_settings
    from hostagent.health import HealthOptions
    host, _ = make_node("t4x2")

    async def scenario():
        agent = Agent(host, load_settings(host))
        await agent.start()
        link = agent.health_link = HealthLink(agent, HealthOptions(quiet_period=None, wait_timeout_ms=100,
                                                                   state_file=False))
        try:
            await link.start(agent.inventory)
            uuid = agent.inventory.gpus[0].uuid
            await asyncio.to_thread(subprocess.run, CLI + ["--simulate", str(host.root), "sim", "xid", "--gpu",
                                                           "0", "--xid", "48"], check=True, timeout=60)
            deadline = time.monotonic() + 10
            while agent.health[uuid].state != "unhealthy":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            first = link.monitor
            first._stop.set()                                  # its thread ends, as if it died
            first._thread.join(5)
            await link.check()
            assert link.monitor is not first and link.running
            assert agent.health[uuid].state == "unhealthy" and "XID 48" in agent.health[uuid].message
            assert link.monitor.last_xids() == {uuid: 48}
        finally:
            await link.stop()
            agent.close()
    asyncio.run(scenario())
