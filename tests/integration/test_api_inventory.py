"""Read endpoints and the watch stream, against the real daemon on a simulated DGX A100."""

import json
import socket
import subprocess
from urllib.parse import quote

import pytest

from hostagent.api.schema import document_bytes
from hostagent.errors import NotFoundError, UsageError
from tests.rootneeds import GPU_CHANGES

from .agentd import AgentProcess, make_root, running_agent


@pytest.fixture(scope="module")
def agent():
    with running_agent(make_root(), {"api": {"watch_heartbeat": 2, "watch_buffer": 16}}) as proc:
        yield proc


def raw(agent, data: bytes, timeout=5) -> bytes:
    """Send bytes, read until the agent closes or a full response arrived."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(agent.socket))
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out


def smi(agent, *args):
    subprocess.run([str(agent.root / "usr/bin/nvidia-smi"), *args], check=True, capture_output=True)


def test_node_facts(agent):
    with agent.client() as c:
        node = c.node()
    assert node["gpus"] == 8 and node["mig_devices"] == 0
    assert node["driver_version"] and node["cuda_driver_version"] and node["nvml_version"]
    assert node["inventory"]["state"] == "ok"
    assert node["cdi"]["kind"] == "nvidia.com/gpu" and node["cdi"]["devices"] == 17
    assert node["agent"]["api"] == "v1" and node["simulated"] is True
    assert node["revision"] > 0


def test_devices_list_shape(agent):
    with agent.client() as c:
        data = c.devices()
    assert [g["index"] for g in data["gpus"]] == list(range(8))
    g = data["gpus"][0]
    assert g["cdi_devices"] == ["nvidia.com/gpu=0", f"nvidia.com/gpu={g['uuid']}"]
    assert g["health"]["state"] == "healthy" and g["health"]["reason"] == "healthy"   # monitor running
    assert g["allocatable"] is True and g["allocations"] == []
    assert g["mig_capable"] is True and g["product"] == "NVIDIA A100-SXM4-40GB" and g["name"] == "0"
    assert g["mig"] == {"mode": {"current": "disabled", "pending": "disabled"}, "devices": [], "gpu_instances": []}
    assert 0 < g["revision"] <= data["revision"]
    assert data["mig_devices"] == [] and data["unreadable"] == [] and data["unread"] == []


def test_device_by_every_name(agent):
    with agent.client() as c:
        gpu = c.devices()["gpus"][3]
        names = ["3", gpu["uuid"], "nvidia.com/gpu=3", f"nvidia.com/gpu={gpu['uuid']}", "gpu=3"]
        for name in names:
            assert c.device(name)["uuid"] == gpu["uuid"], name
        one = c.device("3")
        assert [p["name"] for p in one["mig"]["profiles"]][:2] == ["1g.5gb", "1g.5gb+me"]
        with pytest.raises(NotFoundError) as e:
            c.device("9")
        assert e.value.code == "not_found"
    # An unencoded CDI name (slash in the path) works too.
    out = raw(agent, b"GET /v1/devices/nvidia.com/gpu=3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 ") and gpu["uuid"].encode() in out


def test_filters_and_profiles(agent):
    with agent.client() as c:
        assert c.devices(type="mig")["gpus"] == []
        assert "profiles" not in c.devices()["gpus"][0]["mig"]
        assert len(c.devices(profiles=True)["gpus"][0]["mig"]["profiles"]) == 7
        with pytest.raises(UsageError):
            c.get("/v1/devices", type="cpu")


def test_openapi_served_is_the_repo_document(agent):
    with agent.client() as c:
        response = c.request("GET", "/v1/openapi.json")
    assert response.body == document_bytes()
    from openapi_spec_validator import validate
    validate(json.loads(response.body))


def test_etag_head_and_keepalive(agent):
    out = raw(agent, b"GET /v1/devices HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"HEAD /v1/devices HTTP/1.1\r\nHost: x\r\n\r\n", timeout=1)
    first, rest = out.split(b"\r\n\r\n", 1)
    etag = [l for l in first.split(b"\r\n") if l.lower().startswith(b"etag:")][0].split(b":", 1)[1].strip()
    length = int([l for l in first.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
    second = rest[length:]
    assert second.startswith(b"HTTP/1.1 200 ") and second.endswith(b"\r\n\r\n")   # HEAD: no body
    out = raw(agent, b"GET /v1/devices HTTP/1.1\r\nIf-None-Match: " + etag + b"\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 304 ")


def test_watch_snapshot_events_and_resume(agent):
    with agent.client() as c:
        events = c.watch()
        snap = next(events)
        assert snap["type"] == "snapshot" and snap["reason"] == "initial"
        assert len(snap["gpus"]) == 8
        start = snap["revision"]
        c2 = agent.client()
        c2.allocate("watch-1", ["5"])
        created = next(events)
        changed = next(events)
        assert created["type"] == "allocation_created" and created["revision"] == start + 1
        assert changed["type"] == "device_changed" and changed["changed"] == ["allocations"]
        assert changed["device"]["allocations"] == ["watch-1"]
        assert changed["revision"] == changed["device"]["revision"] == start + 2
        c2.release("watch-1")
        later = [next(events) for _ in range(2)]
        assert [e["type"] for e in later] == ["allocation_deleted", "device_changed"]
        events.close()
        # Resume from the first revision: exactly the missed events, in order.
        resumed = c2.watch(since=start)
        got = [next(resumed) for _ in range(4)]
        assert [e["revision"] for e in got] == [start + 1, start + 2, start + 3, start + 4]
        resumed.close()
        # A revision the agent never had: a fresh snapshot.
        stream = c2.watch(since=10 ** 15)
        first = next(stream)
        assert first["type"] == "snapshot" and first["reason"] == "too_far_behind"
        stream.close()
        # One that fell out of the 16-event ring: a fresh snapshot, then live events.
        for i in range(5):
            c2.allocate(f"churn-{i}", ["6"])
            c2.release(f"churn-{i}")
        stream = c2.watch(since=start)
        first = next(stream)
        assert first["type"] == "snapshot" and first["reason"] == "too_far_behind"
        assert first["revision"] == start + 4 + 20
        c2.allocate("after", ["6"])
        assert next(stream)["revision"] == first["revision"] + 1
        c2.release("after")
        stream.close()
        c2.close()


def test_watch_of_some_event_types(agent):
    """?types= leaves the other events out; the heartbeat says how far the stream has gone,
    the events left out included; an unknown type is a usage error that names the right one."""
    with agent.client(timeout=2) as c, agent.client() as c2:
        stream = c.watch(types=["device_changed"])
        snap = next(stream)
        assert snap["type"] == "snapshot"
        c2.allocate("typed", ["4"])
        changed = next(stream)
        assert changed["type"] == "device_changed" and changed["revision"] == snap["revision"] + 2
        c2.release("typed")
        assert next(stream)["revision"] == snap["revision"] + 4      # not the allocation_deleted before it
        assert next(stream) == {"type": "heartbeat", "revision": snap["revision"] + 4}
        stream.close()
        with pytest.raises(UsageError) as e:
            next(c.watch(types=["device_changed", "allocation_create"]))
        assert "unknown event type 'allocation_create' (did you mean 'allocation_created'?)" in e.value.message


def test_watch_without_the_device_changes_of_own_allocations(agent):
    """?own= leaves out the device changes only in the caller's allocations (those whose ids
    start with it); a device change in another's still comes, with the whole view; a prefix
    that names no allocation id is a usage error."""
    with agent.client(timeout=2) as c, agent.client() as c2:
        stream = c.watch(types=["device_changed"], own="mine/")
        snap = next(stream)
        c2.allocate("mine/a", ["4"])
        c2.allocate("theirs", ["5"])
        changed = next(stream)
        assert changed["type"] == "device_changed" and changed["device"]["allocations"] == ["theirs"]
        assert changed["revision"] == snap["revision"] + 4 and changed["changed"] == ["allocations"]
        c2.release("mine/a")
        assert next(stream) == {"type": "heartbeat", "revision": snap["revision"] + 6}
        stream.close()
        c2.release("theirs")
        with pytest.raises(UsageError) as e:
            next(c.watch(own="-bad"))
        assert "own '-bad' is not an allocation id prefix" in e.value.message


def test_watch_heartbeat(agent):
    # A request timeout equal to the heartbeat interval (2 s here): stream reads wait for
    # three intervals, as the stream's Hostagent-Heartbeat header tells the client.
    with agent.client(timeout=2) as c:
        response = c.request("GET", "/v1/watch")
        assert response.headers["hostagent-heartbeat"] == "2"
        response.stream.close()
        stream = c.watch()
        snap = next(stream)
        beat = next(stream)
        assert beat == {"type": "heartbeat", "revision": snap["revision"]}
        assert next(stream) == beat
        stream.close()


@pytest.fixture
def own_agent():
    """A daemon of its own, for a test that changes the node's MIG layout."""
    with running_agent(make_root()) as proc:
        yield proc


@GPU_CHANGES
def test_mig_change_behind_the_agents_back(own_agent):
    """nvidia-smi makes MIG devices; a refresh (admin) publishes them with CDI names."""
    agent = own_agent
    smi(agent, "-i", "7", "-mig", "1")
    smi(agent, "-r", "-i", "7")
    smi(agent, "mig", "-i", "7", "-cgi", "1g.5gb,3g.20gb", "-C")
    with agent.client() as c:
        stream = c.watch()
        before = next(stream)["revision"]
        revision = c.refresh()
        assert revision > before
        kinds = set()
        while True:
            e = next(stream)
            kinds.add(e["type"])
            if e["revision"] == revision:
                break
        assert {"device_added", "device_changed"} <= kinds
        stream.close()
        migs = c.devices(type="mig")["mig_devices"]
        assert sorted(m["profile"] for m in migs) == ["1g.5gb", "3g.20gb"]
        m = migs[0]
        assert m["parent_index"] == 7 and m["cdi_devices"] == [f"nvidia.com/gpu={m['name']}",
                                                               f"nvidia.com/gpu={m['uuid']}"]
        assert c.device(m["name"])["uuid"] == m["uuid"] == c.device(quote(m["uuid"]))["uuid"]
        gpu7 = c.device("7")
        assert gpu7["mig"]["mode"]["current"] == "enabled" and gpu7["allocatable"] is False and gpu7["cdi_devices"] == []


def test_sigterm_ends_watch_streams_cleanly():
    """A stop is not a crash: every watch ends with a 'stopping' line and the stream's
    zero-length chunk (curl exits 0, the client's iterator just ends)."""
    import signal
    from tests.programs import installed
    curl_path = installed("curl")
    agent = AgentProcess(make_root()).start()
    curl = None
    try:
        curl = subprocess.Popen([curl_path, "-sN", "--unix-socket", str(agent.socket),
                                 "http://localhost/v1/watch"], stdout=subprocess.PIPE)
        assert json.loads(curl.stdout.readline())["type"] == "snapshot"
        c = agent.client()
        stream = c.watch()
        snap = next(stream)
        agent.signal(signal.SIGTERM)
        rest = list(stream)                 # ends without an error: the last chunk came
        assert rest[-1] == {"type": "stopping", "revision": snap["revision"]}
        assert agent.proc.wait(15) == 0
        out, _ = curl.communicate(timeout=15)
        assert curl.returncode == 0
        assert json.loads(out.splitlines()[-1])["type"] == "stopping"
    finally:
        if curl is not None and curl.poll() is None:
            curl.kill()
            curl.wait()
        agent.cleanup()


@GPU_CHANGES
def test_client_mig_methods():
    with running_agent(make_root()) as agent:
        with agent.client(timeout=None) as c:
            assert [g["mig"]["mode"]["current"] == "enabled" for g in c.mig()["gpus"]] == [False] * 8
            plan = c.mig_plan("all-1g.5gb")["plan"]
            assert plan["config"] == "all-1g.5gb" and plan["changed"] == list(range(8))
            assert c.mig_apply("all-1g.5gb", dry_run=True)["dry_run"] is True
            applied = c.mig_apply("all-1g.5gb")
            assert applied["changed"] == list(range(8)) and len(c.devices(type="mig")["mig_devices"]) == 56
            gone = c.mig_destroy_instance(c.devices(type="mig")["mig_devices"][0]["uuid"])
            made = c.mig_create_instance("1g.5gb", gpu=gone["parent_index"])
            assert made["parent_uuid"] == gone["parent_uuid"] and made["profile"] == "1g.5gb"
            with pytest.raises(NotFoundError):
                c.mig_plan("nope")
