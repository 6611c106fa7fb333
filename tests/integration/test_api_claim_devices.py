"""What a DRA claim asks of the agent beyond picking devices, on a simulated DGX A100:
MIG devices made at the exact placements an allocation names and destroyed with it (all or
nothing, journaled across a crash), each device shared its own way, and the GPUs'
time-slices set for time-slicing allocations and restored when the last one goes."""

import json
import os
import subprocess
import time

import pytest

from hostagent.client import Request
from hostagent.errors import ConflictError, UsageError
from hostagent.sim.store import SimStore

from tests.rootneeds import GPU_CHANGES

from .agentd import FAST, make_root, running_agent

pytestmark = GPU_CHANGES               # MIG modes and instances, compute modes, MPS daemons
MODES = {"version": "v1", "mig-configs": {"modes": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {}},
                                                   {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": False}]}}


@pytest.fixture(scope="module")
def agent():
    with running_agent(make_root(), FAST) as a:
        with a.client(timeout=None) as c:
            c.mig_apply("modes", spec=MODES)
        yield a


@pytest.fixture(autouse=True)
def clean(agent):
    yield
    with agent.client() as c:
        for a in c.allocations():
            c.release(a["id"])
        assert c.devices(type="mig")["mig_devices"] == [], "a test left a MIG device"


def timeslices(agent) -> list[int]:
    return [g.timeslice for g in SimStore(agent.root).read().gpus]


def item(gpu, profile, start, **extra):
    return {"mig": {"gpu": str(gpu), "profile": profile, "start": start}, **extra}


def test_mig_devices_are_made_at_the_placements_asked_and_destroyed_with_their_allocation(agent):
    with agent.client() as c:
        gpu = c.device("0")
        alloc = c.allocate("claim-a", [item(0, "1g.5gb", 3), item(0, "3g.20gb", 4), item(1, "2g.10gb", 2)])
        assert [(m["gpu"], m["profile"], m["start"]) for m in alloc["made"]] == [
            (gpu["uuid"], "1g.5gb", 3), (gpu["uuid"], "3g.20gb", 4), (c.device("1")["uuid"], "2g.10gb", 2)]
        assert alloc["devices"] == [m["uuid"] for m in alloc["made"]]
        for m in alloc["made"]:
            view = c.device(m["uuid"])
            assert (view["profile"], view["placement"]["start"], view["made_for"]) == (m["profile"], m["start"],
                                                                                     "claim-a")
            # One compute instance spanning its GPU instance's compute slices.
            assert view["ci_placement"] == {"start": 0, "size": {"1g.5gb": 1, "3g.20gb": 3, "2g.10gb": 2}[m["profile"]]}
        # A retry is the same allocation: nothing more made.
        again = c.allocate("claim-a", [item(0, "1g.5gb", 3), item(0, "3g.20gb", 4), item(1, "2g.10gb", 2)])
        assert again["made"] == alloc["made"] and len(c.devices(type="mig")["mig_devices"]) == 3
        # Slices it holds cannot be had by another.
        with pytest.raises(ConflictError) as e:
            c.allocate("claim-b", [item(0, "2g.10gb", 2)])
        assert e.value.code == "insufficient_resources" and "held by 1g.5gb@3" in e.value.message
        c.release("claim-a")
        assert c.devices(type="mig")["mig_devices"] == []


@pytest.mark.parametrize("items, error, words", [
    ([item(0, "1g.5gb", 7)], UsageError, "devices[0].mig.start: 1g.5gb cannot start at memory slice 7"),
    ([item(0, "9g.99gb", 0)], UsageError, "devices[0].mig.profile: GPU 0 has no MIG profile '9g.99gb'"),
    ([item(3, "1g.5gb", 0)], ConflictError, "devices[0].mig: MIG is not enabled on GPU 3"),
    ([item(0, "1g.5gb", 0), item(0, "2g.10gb", 0)], ConflictError, "devices[1].mig: memory slices 0-1"),
    ([item(0, "1g.5gb+me", 0), item(0, "1g.5gb+me", 1)], ConflictError, "cannot hold a 1g.5gb+me beside"),
])
def test_a_placement_the_gpu_cannot_take_is_refused_and_nothing_is_made(agent, items, error, words):
    with agent.client() as c:
        with pytest.raises(error) as e:
            c.allocate("claim-bad", items)
        assert words in e.value.message, e.value.message
        assert c.devices(type="mig")["mig_devices"] == [] and c.allocations() == []


def test_what_was_made_is_destroyed_when_the_rest_of_the_allocation_fails(agent):
    with agent.client() as c:
        c.allocate("holder", ["5"])
        with pytest.raises(ConflictError) as e:
            c.allocate("claim-c", [item(0, "7g.40gb", 0), {"device": "5"}])
        assert e.value.code == "device_busy"
        assert c.devices(type="mig")["mig_devices"] == [] and [a["id"] for a in c.allocations()] == ["holder"]


def test_a_crash_before_the_commit_is_undone_at_the_next_start(agent):
    with agent.client() as c:
        uuid = c.device("1")["uuid"]
    # What a crash leaves: the journal, and the device it names made.
    subprocess.run([str(agent.root / "usr/bin/nvidia-smi"), "mig", "-i", "1", "-cgi", "2g.10gb:0", "-C"], check=True,
                   capture_output=True)
    (agent.host.state_dir / "allocation-making.json").write_text(json.dumps(
        {"id": "claim-crashed", "made": [{"gpu": uuid, "profile": "2g.10gb", "start": 0}]}))
    with agent.client() as c:
        c.refresh()
        [made] = c.devices(type="mig")["mig_devices"]
        assert made["placement"]["start"] == 0 and made["made_for"] is None
    agent.stop()
    agent.start()
    with agent.client() as c:
        assert c.devices(type="mig")["mig_devices"] == []
    assert not (agent.host.state_dir / "allocation-making.json").exists()
    assert "MIG devices made for claim-crashed before a crash destroyed (1)" in agent.log()


def test_an_unreadable_making_journal_is_set_aside_and_said(agent):
    """Never dropped quietly: kept beside, as it was, and an error in the log."""
    path = agent.host.state_dir / "allocation-making.json"
    path.write_text('{"id": "claim-x", "made": [{"gpu": ')
    agent.stop()
    agent.start()
    [aside] = agent.host.state_dir.glob("allocation-making.json.unreadable-*")
    assert aside.read_text() == '{"id": "claim-x", "made": [{"gpu": ' and not path.exists()
    assert f"hostagentd: error: MIG journal {path} cannot be read" in agent.log()
    aside.unlink()


def test_each_device_its_own_sharing_and_time_slices_set_and_restored(agent):
    long_ = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    short = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}
    with agent.client() as c:
        a = c.allocate("claim-ts", [{"device": "3", "sharing": long_}, {"device": "4"}])
        assert a["sharing"]["strategy"] == "Exclusive" and list(a["device_sharing"].values()) == [long_]
        assert timeslices(agent)[3:5] == [3, 0]
        # GPU 3 is time-sliced: another time-slicing allocation may share it (its interval
        # wins while it lasts); GPU 4 is exclusive.
        c.allocate("other-ts", ["3"], sharing=short)
        assert timeslices(agent)[3] == 1
        with pytest.raises(ConflictError):
            c.allocate("other-ts-4", ["4"], sharing=short)
        c.release("other-ts")
        assert timeslices(agent)[3] == 3
        # A restart keeps the interval (and does not set it again); the last release restores Default.
        agent.stop()
        agent.start()
    with agent.client() as c:
        assert timeslices(agent)[3] == 3
        c.release("claim-ts")
        assert timeslices(agent)[3:5] == [0, 0]
        assert not (agent.host.state_dir / "timeslices.json").read_text().strip("{}\n")


def test_a_damaged_time_slices_state_keeps_what_it_can_and_says_so(agent):
    """The state file cut short by a disk's damage: the interval an allocation set that can
    still be read from it is restored to Default when the allocation goes, the file as it
    was is kept beside it, and the log says so as an error (it was read as empty, silently,
    and the GPU kept the allocation's interval for good)."""
    long_ = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    state = agent.host.state_dir / "timeslices.json"
    with agent.client() as c:
        c.allocate("claim-ts", [{"device": "3", "sharing": long_}])
        uuid = c.device("3")["uuid"]
    assert timeslices(agent)[3] == 3
    agent.stop()
    damaged = state.read_text().rstrip("}\n") + ', "GPU-'            # a second entry cut short
    state.write_text(damaged)
    agent.start()
    assert f"hostagentd: error: time-slices state {state} cannot be read" in agent.log()
    assert f"the intervals read from it: {uuid} Long" in agent.log()
    [aside] = agent.host.state_dir.glob("timeslices.json.unreadable-*")
    assert aside.read_text() == damaged and json.loads(state.read_text()) == {uuid: "Long"}
    with agent.client() as c:
        c.release("claim-ts")
    assert timeslices(agent)[3] == 0
    aside.unlink()


def test_time_slices_come_back_to_the_earlier_one_across_agent_restarts(agent):
    """Two claims time-slice GPU 5, the later's interval in force; the agent restarts; the
    later claim goes and the earlier one's interval comes back; another restart; the last
    claim goes and the GPU is back at the Default it had before them."""
    short = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}
    long_ = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    assert timeslices(agent)[5] == 0
    with agent.client() as c:
        c.allocate("claim-earlier", [{"device": "5", "sharing": short}])
        c.allocate("claim-later", [{"device": "5", "sharing": long_}])
        assert timeslices(agent)[5] == 3
    agent.stop()
    agent.start()
    with agent.client() as c:
        assert timeslices(agent)[5] == 3
        c.release("claim-later")
        assert timeslices(agent)[5] == 1                    # the earlier claim's Short
    agent.kill()                                            # even without a clean stop
    agent.start()
    with agent.client() as c:
        assert timeslices(agent)[5] == 1
        c.release("claim-earlier")
    assert timeslices(agent)[5] == 0
    assert not (agent.host.state_dir / "timeslices.json").read_text().strip("{}\n")


def committed_in_the_journal(agent, alloc_id: str) -> bool:
    from hostagent.daemon import checkpoint
    path = checkpoint.journal_path(agent.host)
    return path.exists() and json.dumps(alloc_id) in path.read_text()


def test_a_claims_allocation_survives_a_kill9_of_the_agent(agent):
    """Committed as a journal line, an allocation keeps what was made for it and how each
    device is shared across a kill -9: its MIG device is not taken for a crash's leftover,
    its time-slice stays set, and releasing it afterwards undoes both."""
    long_ = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    with agent.client() as c:
        c.allocate("warm", ["5"])
        made = c.allocate("claim-k9", [item(0, "3g.20gb", 4), {"device": "3", "sharing": long_}])
        c.release("warm")
    assert committed_in_the_journal(agent, "claim-k9")
    agent.kill()
    agent.start()
    with agent.client() as c:
        kept = c.allocation("claim-k9")
        for key in ("devices", "made", "device_sharing", "owner", "sharing"):
            assert kept[key] == made[key], key
        [mig] = c.devices(type="mig")["mig_devices"]
        assert (mig["uuid"], mig["made_for"]) == (made["made"][0]["uuid"], "claim-k9")
        assert timeslices(agent)[3] == 3
        c.release("claim-k9")
        assert c.devices(type="mig")["mig_devices"] == [] and timeslices(agent)[3] == 0
    assert "made for claim-k9 before a crash" not in agent.log()


def test_a_mig_device_item_may_not_name_a_device_too(agent):
    with agent.client() as c:
        response = c.transport.handle_request(Request("POST", "/v1/allocations", json.dumps({"id": "x", "devices": [
            {"mig": {"gpu": "0", "profile": "1g.5gb", "start": 0}, "device": "1"}]}).encode(), {}))
        assert response.status == 400 and json.loads(response.body)["code"] == "invalid_argument"


def test_a_made_device_still_in_use_keeps_its_allocation_until_it_is_free(agent):
    from hostagent.sim.control import hold, release
    with agent.client() as c:
        [made] = c.allocate("claim-busy", [item(0, "2g.10gb", 0)])["made"]
        holder = hold(SimStore(agent.root), c.device(made["uuid"])["name"])
        try:
            with pytest.raises(ConflictError) as e:
                c.release("claim-busy")
            assert e.value.code == "in_use"
            assert [a["id"] for a in c.allocations()] == ["claim-busy"]
            assert c.device(made["uuid"])["made_for"] == "claim-busy"
        finally:
            release(SimStore(agent.root), holder.pid)
        c.release("claim-busy")
        assert c.devices(type="mig")["mig_devices"] == []


MPS_50 = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                           "defaultPinnedDeviceMemoryLimit": "10240Mi"}}


def test_an_allocation_gets_an_mps_daemon_of_its_own_for_the_devices_the_node_does_not_share(agent):
    from hostagent.processes import ProcessRecord, current
    from hostagent.sharing import mps

    from .mpsprocs import on_pipe, running
    with agent.client() as c:
        # Without asking for one, MPS needs the node's sharing configuration.
        with pytest.raises(ConflictError) as e:
            c.allocate("claim-mps", [{"device": "6", "sharing": MPS_50}])
        assert e.value.code == "device_not_allocatable" and "own_mps_daemon" in e.value.message
        gpus = {g["index"]: g["uuid"] for g in c.devices(type="gpu")["gpus"]}
        a = c.allocate("claim-mps", [{"device": "6", "sharing": MPS_50}, {"device": "7", "sharing": MPS_50},
                                     {"device": "5"}], own_mps_daemon=True, cdi_names="allocation")
        key = a["mps"]["key"]
        assert a["mps"]["devices"] == [gpus[6], gpus[7]] and key.startswith("alloc-")
        record = ProcessRecord.from_dict(a["mps"]["process"])
        assert current(record) and on_pipe(agent.host, key) == [record.pid]
        # It serves those two GPUs alone, in EXCLUSIVE_PROCESS while it runs, with the claim's limits.
        log = (mps.log_dir(agent.host, key) / "control.log").read_text()
        assert f"CUDA_VISIBLE_DEVICES={gpus[6]},{gpus[7]}" in log
        modes = [g.compute_mode for g in SimStore(agent.root).read().gpus]
        assert modes[5:8] == [0, 3, 3]          # NVML_COMPUTEMODE_DEFAULT, EXCLUSIVE_PROCESS
        assert mps.ask(agent.host, key, ["get_default_active_thread_percentage"]) == ["50.0"]
        assert mps.ask(agent.host, key, ["get_default_device_pinned_mem_limit 1"]) == ["10240M"]
        # Its clients get the daemon's socket alone, read-only, and the limits; GPU 5 none of it.
        spec = json.loads(open(a["spec_path"]).read())
        by_device = {d["name"]: d["containerEdits"] for d in spec["devices"]}
        mps_edits = [e for e in by_device.values() if any(m["containerPath"] == "/tmp/nvidia-mps"
                                                          for m in e.get("mounts", ()))]
        assert len(mps_edits) == 2
        mount = next(m for m in mps_edits[0]["mounts"] if m["containerPath"] == "/tmp/nvidia-mps")
        assert mount["hostPath"].endswith(f"/mps/{key}/client") and "ro" in mount["options"]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in mps_edits[0]["env"]
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M,1=10240M" in mps_edits[0]["env"]
        # Its devices are its own: another allocation gets neither.
        with pytest.raises(ConflictError):
            c.allocate("other", [{"device": "6", "sharing": MPS_50}], own_mps_daemon=True)
        # A daemon that exits is started again; a restarted agent adopts the running one.
        import signal
        os.kill(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while True:
            now = c.allocation("claim-mps")["mps"]["process"]
            if now["pid"] != record.pid and current(ProcessRecord.from_dict(now)):
                break
            assert time.monotonic() < deadline, "the daemon was not started again"
            time.sleep(0.1)
    agent.stop()
    agent.start()
    with agent.client() as c:
        assert c.allocation("claim-mps")["mps"]["process"] == now
        c.release("claim-mps")
    assert not on_pipe(agent.host, key) and not mps.daemon_dir(agent.host, key).exists()
    assert [g.compute_mode for g in SimStore(agent.root).read().gpus][5:8] == [0, 0, 0]
    assert running(agent.root) == []


def test_an_own_daemons_pinned_limit_is_at_most_the_devices_memory(agent):
    """A limit above the GPU's memory (a DRA claim's "1e400" became a 395-digit MiB limit in
    the daemon and its clients' environment) is refused, and nothing is started."""
    from hostagent.errors import UsageError
    from hostagent.sharing import mps
    with agent.client() as c:
        memory = c.device("6")["memory_mib"]
        for limit, words in ((f"{memory + 1}Mi", f"({memory + 1} MiB) is more than its memory ({memory} MiB)"),
                             ("9" * 25, "body.devices[0].sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
                                        f"'{'9' * 25}' is too long")):          # the schema: 24 characters at most
            sharing = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}}
            with pytest.raises(UsageError) as e:
                c.allocate("claim-big", [{"device": "6", "sharing": sharing}], own_mps_daemon=True)
            assert e.value.code == "invalid_argument" and words in e.value.message, e.value.message
        assert c.allocations() == [] and not list(mps.daemon_dir(agent.host, "x").parent.glob("alloc-*"))
        sharing = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": f"{memory}Mi"}}
        c.allocate("claim-all", [{"device": "6", "sharing": sharing}], own_mps_daemon=True)
    assert SimStore(agent.root).read().gpus[6].compute_mode == 3


def test_a_daemon_no_allocation_has_is_stopped_at_start(agent):
    from hostagent.daemon import checkpoint
    from hostagent.sharing import mps

    from .mpsprocs import on_pipe
    with agent.client() as c:
        key = c.allocate("claim-left", [{"device": "4", "sharing": MPS_50}], own_mps_daemon=True)["mps"]["key"]
    assert on_pipe(agent.host, key)
    agent.stop()
    # What a crash between the daemon's start and the allocation's commit leaves: a daemon
    # the checkpoint does not name.
    # The allocation may be in the snapshot or in a journal line: the checkpoint without it
    # is a snapshot of the rest and no journal.
    kept = [a.checkpoint() for a in checkpoint.read(agent.host) if a.id != "claim-left"]
    checkpoint.path(agent.host).write_text(json.dumps({"version": checkpoint.VERSION, "allocations": kept}))
    checkpoint.journal_path(agent.host).unlink(missing_ok=True)
    agent.start()
    assert not on_pipe(agent.host, key) and not mps.daemon_dir(agent.host, key).exists()
    assert f"MPS daemon {key} stopped: no allocation has it" in agent.log()
    assert SimStore(agent.root).read().gpus[4].compute_mode == 0          # DEFAULT again


def test_an_allocations_own_mps_daemon_is_adopted_after_a_kill9_of_the_agent(agent):
    from .mpsprocs import on_pipe, running
    with agent.client() as c:
        c.allocate("warm", ["5"])
        a = c.allocate("claim-mps-k9", [{"device": "6", "sharing": MPS_50}], own_mps_daemon=True)
        c.release("warm")
    assert committed_in_the_journal(agent, "claim-mps-k9")
    agent.kill()
    agent.start()
    with agent.client() as c:
        assert c.allocation("claim-mps-k9")["mps"] == a["mps"]         # the same daemon, adopted
        assert on_pipe(agent.host, a["mps"]["key"]) == [a["mps"]["process"]["pid"]]
        c.release("claim-mps-k9")
    assert not on_pipe(agent.host, a["mps"]["key"]) and running(agent.root) == []
    assert SimStore(agent.root).read().gpus[6].compute_mode == 0
