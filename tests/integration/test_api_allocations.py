"""Allocations against the real daemon: selection, idempotency, conflicts, sharing, the
transient spec, and restarts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hostagent.cdi.validate import validate_spec
from hostagent.client import Request
from hostagent.daemon import checkpoint
from hostagent.errors import ConflictError, NotFoundError, UsageError
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import make_root, running_agent


def smi(root, *args):
    subprocess.run([str(root / "usr/bin/nvidia-smi"), *args], check=True, capture_output=True)


# Its node has MIG devices (root's to make): each test on it is marked GPU_CHANGES.
@pytest.fixture(scope="module")
def agent():
    root = make_root()
    # GPU 0 split into MIG devices: 3g.20gb, 2g.10gb, 1g.5gb x2 (before the daemon starts).
    smi(root, "-i", "0", "-mig", "1")
    smi(root, "-r", "-i", "0")
    smi(root, "mig", "-i", "0", "-cgi", "3g.20gb,2g.10gb,1g.5gb,1g.5gb", "-C")
    with running_agent(root) as proc:
        yield proc


@pytest.fixture
def c(agent):
    with agent.client() as client:
        yield client
        for a in client.allocations():
            client.release(a["id"])


def spec_files(agent):
    return sorted(p.name for p in (agent.root / "var/run/cdi").iterdir())


@GPU_CHANGES
def test_by_name_uuid_and_cdi_name(agent, c):
    gpus = c.devices()["gpus"]
    a = c.allocate("claim-a", ["1", gpus[2]["uuid"], "nvidia.com/gpu=3"])
    assert a["devices"] == [gpus[1]["uuid"], gpus[2]["uuid"], gpus[3]["uuid"]]
    assert a["cdi_devices"] == ["hostagent.io/allocation=claim-a-gpu1", "hostagent.io/allocation=claim-a-gpu2",
                                "hostagent.io/allocation=claim-a-gpu3"]
    assert a["visible_devices"] == ",".join(a["devices"])
    spec = json.loads((agent.root / "var/run/cdi/hostagent.io-allocation_claim-a.json").read_text())
    assert validate_spec(spec) == []
    assert spec["kind"] == "hostagent.io/allocation"
    assert [d["name"] for d in spec["devices"]] == ["claim-a-gpu1", "claim-a-gpu2", "claim-a-gpu3"]
    # GPU 1's node is named by its device minor (3 on this profile), not its index.
    minors = [g["minor"] for g in gpus]
    assert minors[1:4] == [3, 0, 1]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia3"
    # The equivalent plain edits (no hook): every device node, the driver's libraries and
    # their SONAMEs as mounts, the devices in the env.
    edits = a["container_edits"]
    assert set(edits) == {"env", "deviceNodes", "mounts"}
    paths = [n["path"] for n in edits["deviceNodes"]]
    assert {"/dev/nvidiactl", "/dev/nvidia3", "/dev/nvidia0", "/dev/nvidia1"} <= set(paths)
    assert "/dev/nvidia2" not in paths                  # GPU 0's
    assert any(m["containerPath"].endswith("libcuda.so.550.90.07") for m in edits["mounts"])
    assert any(m["containerPath"].endswith("/libcuda.so.1") for m in edits["mounts"])
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=" + ",".join(a["devices"])]
    # The devices say who uses them.
    assert c.device("2")["allocations"] == ["claim-a"]
    assert c.allocation("claim-a")["devices"] == a["devices"]


def test_the_longest_ids_get_a_spec_file_of_their_own(agent, c):
    """Ids of 128 characters whose '.', '_' and '/' escape to more than a file name holds
    (255 bytes): each still gets its own spec file and device names."""
    ids = ["a" + "_" * 126 + "b", "a" + "/" * 126 + "b", "a" + "._" * 63 + "b"]
    made = [c.allocate(alloc_id, [str(n + 4)]) for n, alloc_id in enumerate(ids)]
    assert len({Path(a["spec_path"]).name for a in made}) == 3 and all(Path(a["spec_path"]).exists() for a in made)
    assert len({a["cdi_devices"][0] for a in made}) == 3
    for a in made:
        assert validate_spec(json.loads(Path(a["spec_path"]).read_text())) == []


@GPU_CHANGES
def test_constraints_pick_best_fit(c):
    # A MIG profile.
    a = c.allocate("p1", [{"constraints": {"profile": "1g.5gb"}, "count": 2}])
    assert [c.device(u)["profile"] for u in a["devices"]] == ["1g.5gb", "1g.5gb"]
    assert all(name.startswith("hostagent.io/allocation=p1-mig0:") for name in a["cdi_devices"])
    # Minimum memory: the smallest device that fits (the 2g.10gb MIG device), not a GPU.
    b = c.allocate("m1", [{"constraints": {"min_memory_mib": 9000}}])
    assert c.device(b["devices"][0])["profile"] == "2g.10gb"
    # Whole GPUs by product and compute capability.
    g = c.allocate("g1", [{"constraints": {"type": "gpu", "product": "a100-sxm4", "compute_capability": "8.0"},
                           "count": 3}])
    assert [c.device(u)["index"] for u in g["devices"]] == [1, 2, 3]
    with pytest.raises(ConflictError) as e:
        c.allocate("cc", [{"constraints": {"compute_capability": "9.0"}}])
    assert e.value.code == "insufficient_devices" and e.value.details["matching"] == 0
    with pytest.raises(ConflictError) as e:
        c.allocate("many", [{"constraints": {"profile": "1g.5gb"}}])   # both taken by p1
    assert e.value.code == "insufficient_devices" and e.value.details["matching"] == 2


@GPU_CHANGES
def test_idempotent_and_conflicting_ids(agent, c):
    first = c.allocate("same", [{"constraints": {"type": "gpu"}}])
    again = c.allocate("same", [{"constraints": {"type": "gpu"}}])
    assert again["devices"] == first["devices"] and again["created"] == first["created"]
    response = c.request("POST", "/v1/allocations", {"id": "same", "devices": [{"constraints": {"type": "gpu"}}]})
    assert response.status == 200
    with pytest.raises(ConflictError) as e:
        c.allocate("same", ["5"])
    assert e.value.code == "allocation_conflict"
    # The same devices spelled another way (index, UUID, CDI name) are the same request.
    named = c.allocate("named", ["5"])
    gpu5 = c.device("5")
    for spelling in (gpu5["uuid"], "nvidia.com/gpu=5", gpu5["cdi_devices"][-1]):
        assert c.transport.handle_request(Request("POST", "/v1/allocations", json.dumps(
            {"id": "named", "devices": [{"device": spelling}]}).encode())).status == 200
        assert c.allocate("named", [spelling])["created"] == named["created"]
    # Busy device, by another exclusive allocation.
    with pytest.raises(ConflictError) as e:
        c.allocate("other", [first["devices"][0]])
    assert e.value.code == "device_busy" and e.value.details["allocations"] == ["same"]
    # Ids that CDI's '/' -> '_' alone would give one spec file name: each its own.
    slashed, underscored = c.allocate("ns/pod", ["6"]), c.allocate("ns_pod", ["7"])
    assert {"hostagent.io-allocation_ns_pod.json", "hostagent.io-allocation_ns._pod.json"} <= set(spec_files(agent))
    assert slashed["spec_path"] != underscored["spec_path"]
    assert set(slashed["cdi_devices"]).isdisjoint(underscored["cdi_devices"])


@GPU_CHANGES
def test_not_allocatable_and_unknown(c):
    with pytest.raises(ConflictError) as e:
        c.allocate("whole0", ["0"])          # MIG is enabled on GPU 0
    assert e.value.code == "device_not_allocatable"
    with pytest.raises(UsageError) as e:
        c.allocate("nope", ["GPU-00000000-0000-0000-0000-000000000000"])
    assert e.value.code == "unknown_device" and e.value.status == 422
    with pytest.raises(UsageError) as e:
        c.allocate("twice", ["1", "nvidia.com/gpu=1"])
    assert e.value.code == "invalid_argument"
    assert c.allocations() == []


@GPU_CHANGES
def test_sharing_rules(c):
    ts = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}
    a = c.allocate("ts-1", ["4"], sharing=ts)
    b = c.allocate("ts-2", ["4"], sharing={"strategy": "TimeSlicing"})
    assert a["devices"] == b["devices"]
    assert b["sharing"] == {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
    with pytest.raises(ConflictError) as e:        # MPS needs the daemon the sharing configuration runs
        c.allocate("mps-1", ["5"], sharing={"strategy": "MPS"})
    assert e.value.code == "device_not_allocatable" and "not shared with MPS" in e.value.message
    with pytest.raises(ConflictError):
        c.allocate("excl", ["4"])
    # Constraint groups spread shared allocations over the least shared devices.
    m = c.allocate("ts-3", [{"constraints": {"type": "gpu"}, "count": 2}], sharing={"strategy": "TimeSlicing"})
    assert c.device("4")["uuid"] not in m["devices"]
    with pytest.raises(UsageError):
        c.allocate("bad", ["5"], sharing={"strategy": "TimeSlicing", "mpsConfig": {}})
    assert sorted(c.device("4")["allocations"]) == ["ts-1", "ts-2"]
    assert c.allocation("ts-1")["replicas"] == []       # the node does not share it: no replicas


@GPU_CHANGES
def test_release(agent, c):
    c.allocate("rel", ["5"])
    assert "hostagent.io-allocation_rel.json" in spec_files(agent)
    gone = c.release("rel")
    assert gone["id"] == "rel"
    assert "hostagent.io-allocation_rel.json" not in spec_files(agent)
    with pytest.raises(NotFoundError) as e:      # a retried release: already gone
        c.release("rel")
    assert e.value.code == "not_found" and "already" in e.value.message
    assert c.release("rel", missing_ok=True) is None
    with pytest.raises(NotFoundError):
        c.allocation("rel")


@GPU_CHANGES
def test_node_names_answer_without_a_transient_spec(agent, c):
    before = spec_files(agent)
    gpus = c.devices()["gpus"]
    own = c.allocate("own", ["5"])
    c.release("own")
    a = c.allocate("ns/pod/node-named", ["5", "0:1"], cdi_names="node")
    mig = c.device("0:1")
    assert a["cdi_devices"] == [f"nvidia.com/gpu={gpus[5]['uuid']}", f"nvidia.com/gpu={mig['uuid']}"]
    node_spec = json.loads(Path(c.node()["cdi"]["spec"]).read_text())
    assert {n.split("=", 1)[1] for n in a["cdi_devices"]} <= {d["name"] for d in node_spec["devices"]}
    assert a["spec_path"] is None and spec_files(agent) == before
    # The same edits as an allocation with a spec of its own, where CDI cannot be used.
    gpu5 = {n["path"] for n in own["container_edits"]["deviceNodes"]}
    assert gpu5 <= {n["path"] for n in a["container_edits"]["deviceNodes"]}
    assert a["container_edits"]["mounts"] == own["container_edits"]["mounts"]
    assert a["visible_devices"] == f"{gpus[5]['uuid']},{mig['uuid']}"
    # Idempotent as any other; asked again for a spec of its own, it is another request.
    assert c.allocate("ns/pod/node-named", [gpus[5]["uuid"], mig["uuid"]], cdi_names="node") == a
    with pytest.raises(ConflictError) as e:
        c.allocate("ns/pod/node-named", ["5", "0:1"])
    assert e.value.code == "allocation_conflict"
    assert c.device("5")["allocations"] == ["ns/pod/node-named"]
    assert c.release("ns/pod/node-named")["id"] == "ns/pod/node-named" and spec_files(agent) == before


@GPU_CHANGES
def test_a_minimal_answer_leaves_the_container_edits_out(agent, c):
    """Prefer: return=minimal (a device plugin that hands on CDI names): the answer without
    its container edits, which the allocation still has."""
    response = c.request("POST", "/v1/allocations", {"id": "minimal", "devices": [{"device": "4"}],
                                                     "cdi_names": "node"},
                         headers={"Prefer": "respond-async, return=minimal"})
    minimal = response.json()
    assert response.status == 201 and response.headers["preference-applied"] == "return=minimal"
    full = c.allocation("minimal")
    assert "container_edits" not in minimal and full["container_edits"]["deviceNodes"]
    assert minimal == {k: v for k, v in full.items() if k != "container_edits"}
    assert "container_edits" in c.allocate("minimal", ["4"], cdi_names="node")     # asked without it
    c.release("minimal")


@GPU_CHANGES
def test_allocations_follow_the_driver_files_of_the_node_spec(agent, c):
    """The driver's files are found once per node spec: a refresh finds a new one for the
    node spec and the allocations made after it alike."""
    added = agent.root / "usr/share/X11/xorg.conf.d/10-nvidia.conf"
    target = "/usr/share/X11/xorg.conf.d/10-nvidia.conf"
    first = c.allocate("before", ["6"], cdi_names="node")
    assert target not in {m["containerPath"] for m in first["container_edits"]["mounts"]}
    added.parent.mkdir(parents=True, exist_ok=True)
    added.write_bytes(b"optix")
    try:
        c.refresh()
        after = c.allocate("after", ["7"], cdi_names="node")
        assert target in {m["containerPath"] for m in after["container_edits"]["mounts"]}
        c.release("before")                  # the same devices as before the refresh: new edits too
        again = c.allocate("again", ["6"], cdi_names="node")
        assert target in {m["containerPath"] for m in again["container_edits"]["mounts"]}
        c.release("again")
        c.release("after")
        node_spec = json.loads(Path(c.node()["cdi"]["spec"]).read_text())
        assert target in {m["containerPath"] for m in node_spec["containerEdits"]["mounts"]}
    finally:
        added.unlink()
        c.refresh()


@GPU_CHANGES
def test_replaces_releases_in_the_same_commit(agent, c):
    start = c.node()["revision"]
    c.allocate("old", ["1", "2"])
    c.allocate("keep", ["3"], cdi_names="node")
    with pytest.raises(ConflictError) as e:
        c.allocate("new", ["2", "4"])
    assert e.value.code == "device_busy"
    # A refused request releases nothing.
    with pytest.raises(ConflictError) as e:
        c.allocate("new", ["3", "4"], replaces=["old"])
    assert e.value.code == "device_busy" and {a["id"] for a in c.allocations()} == {"old", "keep"}
    # Its devices are free for the new one; an id already gone is skipped.
    new = c.allocate("new", ["2", "4"], cdi_names="node", replaces=["old", "gone-already"])
    assert {a["id"] for a in c.allocations()} == {"keep", "new"}
    assert "hostagent.io-allocation_old.json" not in spec_files(agent)
    assert sorted(a.id for a in checkpoint.read(agent.host)) == ["keep", "new"]
    assert c.device("2")["allocations"] == ["new"] and c.device("1")["allocations"] == []
    # A retry is the same request, with or without what it replaced (released if left).
    assert c.allocate("new", ["2", "4"], cdi_names="node") == new
    c.allocate("left", ["5"])
    assert c.allocate("new", ["2", "4"], cdi_names="node", replaces=["left"]) == new
    assert {a["id"] for a in c.allocations()} == {"keep", "new"}
    # The replaced allocation's deletion comes before the creation that replaced it.
    events = []
    with agent.client() as w:
        for e in w.watch(since=start):
            if e["type"].startswith("allocation_"):
                events.append((e["type"], e["allocation"]["id"], e.get("reason")))
            if e["type"] == "allocation_created" and e["allocation"]["id"] == "new":
                break
    assert events[-2:] == [("allocation_deleted", "old", "replaced by new"), ("allocation_created", "new", None)]


@GPU_CHANGES
def test_sharing_limits_per_device_and_node(agent):
    """allocations.max_per_device bounds how many allocations share one device and
    allocations.max_total how many the node has; a reload changes them."""
    agent.write_config({"daemon": {"resync_interval": 0}, "allocations": {"max_per_device": 2, "max_total": 4}})
    _reload(agent)
    ts = {"strategy": "TimeSlicing"}
    with agent.client() as c:
        try:
            c.allocate("s1", ["4"], sharing=ts)
            c.allocate("s2", ["4"], sharing=ts)
            with pytest.raises(ConflictError) as e:
                c.allocate("s3", ["4"], sharing=ts)
            assert e.value.code == "share_limit_reached" and e.value.details["limit"] == 2
            assert "allocations.max_per_device" in e.value.message
            # Constraint groups pass over the full device.
            s3 = c.allocate("s3", [{"constraints": {"type": "gpu"}}], sharing=ts)
            assert s3["devices"] != c.allocation("s1")["devices"]
            c.allocate("s4", ["5"], sharing=ts)
            with pytest.raises(ConflictError) as e:
                c.allocate("s5", ["6"])
            assert e.value.code == "allocation_limit_reached" and e.value.details["limit"] == 4
            assert c.allocate("s4", ["5"], sharing=ts)["id"] == "s4"      # a retry is no new one
            agent.write_config({"daemon": {"resync_interval": 0}, "allocations": {"max_per_device": 3}})
            _reload(agent)
            c.allocate("s5", ["4"], sharing=ts)
        finally:
            for a in c.allocations():
                c.release(a["id"])
            agent.write_config({"daemon": {"resync_interval": 0}})
            _reload(agent)


def _reload(agent):
    """SIGHUP, then wait for the reload's log line."""
    import signal
    count = agent.log().count("configuration reloaded")
    agent.signal(signal.SIGHUP)
    until(lambda: agent.log().count("configuration reloaded") != count, 20, lambda: agent.log())


@GPU_CHANGES
def test_restart_keeps_allocations_and_drops_gone_devices():
    root = make_root()
    smi(root, "-i", "1", "-mig", "1")
    smi(root, "-r", "-i", "1")
    smi(root, "mig", "-i", "1", "-cgi", "3g.20gb,3g.20gb", "-C")
    with running_agent(root) as agent:
        with agent.client() as c:
            keep = c.allocate("keep/me", ["2", "3"], labels={"pod": "a"})
            mig = c.allocate("on-mig", [{"constraints": {"profile": "3g.20gb"}}])
        agent.stop()
        # Behind the agent's back: that MIG device is destroyed, and a stray spec appears.
        smi(root, "mig", "-i", "1", "-dci")
        smi(root, "mig", "-i", "1", "-dgi")
        stray = root / "var/run/cdi/hostagent.io-allocation_stray.json"
        stray.write_text((root / "var/run/cdi/hostagent.io-allocation_keep_me.json").read_text())
        agent.start()
        with agent.client() as c:
            ids = [a["id"] for a in c.allocations()]
            assert ids == ["keep/me"]
            again = c.allocation("keep/me")
            assert again["devices"] == keep["devices"] and again["labels"] == {"pod": "a"}
            assert again["cdi_devices"] == keep["cdi_devices"]
            assert c.device("2")["allocations"] == ["keep/me"]
        assert not stray.exists()
        assert not (root / "var/run/cdi/hostagent.io-allocation_on-mig.json").exists()
        log = agent.log()
        assert "allocation on-mig dropped" in log and mig["devices"][0] in log
        assert "removed transient spec" in log and "stray" in log
        assert [a.id for a in checkpoint.read(agent.host)] == ["keep/me"]


def cli(agent, *args):
    return subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(agent.root), *args],
                          capture_output=True, text=True, timeout=120)


@GPU_CHANGES
def test_allocations_listed_and_released_from_the_command_line(agent, c, tmp_path):
    """What a MIG change refuses to take names the command that frees it; --force does not
    take it while the daemon runs, as the docs say."""
    mig = c.allocate("held-mig", ["0:1"])
    listed = json.loads(cli(agent, "allocations", "list", "-o", "json").stdout)
    assert [(a["id"], a["devices"]) for a in listed] == [("held-mig", mig["devices"])]
    table = cli(agent, "allocations", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "DEVICES", "SHARING", "OWNER", "CLIENT", "AGE"] and table[1].startswith("held-mig ")
    spec = tmp_path / "mig.yaml"
    spec.write_text("version: v1\nmig-configs:\n  whole:\n    - {devices: all, mig-enabled: false}\n")
    for force in ((), ("--force",)):
        refused = cli(agent, "mig", "apply", "-f", str(spec), "-c", "whole", *force)
        assert refused.returncode == 1 and "the change would take away allocated device(s)" in refused.stderr
        assert "release their allocations first (hostagent allocations release ID); --force does not take " \
               "allocated devices while the daemon runs" in refused.stderr, refused.stderr
    released = cli(agent, "allocations", "release", "held-mig")
    assert released.returncode == 0 and released.stdout == f"released held-mig: {mig['devices'][0]} free again\n"
    assert c.allocations() == []
    unknown = cli(agent, "allocations", "release", "held-mig")
    assert unknown.returncode == 2 and "no allocation 'held-mig': already released, or never made" in unknown.stderr


def test_allocations_without_the_daemon_say_where_they_live(make_node):
    host, _ = make_node("t4x2")
    done = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), "allocations",
                           "list"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == (
        f"hostagent: error: {host.root}/run/hostagent: the hostagent daemon does not run: allocations live in it "
        "(start it: systemctl start hostagent, or hostagent serve)\n")


@GPU_CHANGES
def test_an_unknown_name_through_the_daemon_is_a_usage_error(agent):
    """The agent's not_found carries the name: the command line exits 2, as it does acting itself."""
    done = cli(agent, "mig", "apply", "-c", "no-such-config")
    assert done.returncode == 2 and "applying through the daemon" in done.stderr
    assert "no MIG config named 'no-such-config'" in done.stderr


@GPU_CHANGES
def test_a_commit_waits_for_the_node_lock_off_the_loop(agent, c):
    """An allocation whose commit is only the checkpoint runs it on the event loop, but never
    waits there for the node lock: while another process holds it, the allocation waits (on
    the worker) and the agent still answers reads; it is made once the lock is free."""
    import threading
    import time
    from hostagent.lock import node_lock
    c.allocate("loop-warm", ["3"], cdi_names="node")            # its devices' edits made once
    c.release("loop-warm")
    done = {}
    with node_lock(agent.host, "test holds the node"):
        def allocate():
            with agent.client() as other:
                done["alloc"] = other.allocate("loop-held", ["3"], cdi_names="node")
        thread = threading.Thread(target=allocate)
        thread.start()
        time.sleep(0.3)
        started = time.monotonic()
        assert c.get("/v1/node")["agent"]["pid"] == agent.proc.pid and time.monotonic() - started < 1.0
        assert "alloc" not in done
    thread.join(10)
    assert done["alloc"]["id"] == "loop-held" and [a["id"] for a in c.allocations() if a["id"] == "loop-held"]
    c.release("loop-held")
