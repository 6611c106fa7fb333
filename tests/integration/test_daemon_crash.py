"""``kill -9`` of the daemon in the middle of allocating or releasing, then a restart: no
leaked spec, no lost allocation, a consistent checkpoint."""

import json
import os
import random
import threading
import time

import pytest

from hostagent.cdi.transient import safe_id
from hostagent.daemon import checkpoint
from hostagent.errors import HostagentError
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import AgentProcess, make_root, running_agent


KIND = "hostagent.io-allocation_"


def state(agent) -> tuple[set, set, set]:
    """(allocations the API lists, transient spec files, checkpointed ids)."""
    with agent.client() as c:
        listed = {a["id"] for a in c.allocations()}
    specs = {p.name[len(KIND):-len(".json")] for p in (agent.root / "var/run/cdi").glob(KIND + "*.json")}
    return listed, specs, {a.id for a in checkpoint.read(agent.host)}


def assert_consistent(agent) -> set:
    listed, specs, saved = state(agent)
    assert listed == saved, (listed, saved)
    assert specs == {safe_id(i) for i in listed}, (specs, listed)
    for tmp in [*(agent.root / "var/run/cdi").glob(".*.tmp"), *(agent.root / "var/lib/hostagent").glob(".*.tmp")]:
        raise AssertionError(f"temporary file left behind: {tmp}")
    return listed


def crash_during(agent, action) -> None:
    """Run ``action(client)``; the daemon kills itself at its fault point."""
    with agent.client() as c:
        with pytest.raises(HostagentError):
            action(c)
    assert agent.proc.wait(10) == -9


@pytest.mark.parametrize("point, survives", [("allocate:after_spec", False),
                                             ("allocate:after_checkpoint", True)])
def test_crash_while_allocating(point, survives):
    """The new allocation replaces an older one: both change in the one commit, or neither."""
    root = make_root()
    with running_agent(root) as agent:
        with agent.client() as c:
            c.allocate("before", ["0"])
            c.allocate("replaced", ["1"])
        agent.stop()
        agent.env = {"HOSTAGENT_FAULT": point}
        agent.start()
        crash_during(agent, lambda c: c.allocate("claim/x", ["1", "2"], replaces=["replaced"]))
        assert (root / f"var/run/cdi/{KIND}claim_x.json").exists()      # died mid-way
        assert (root / f"var/run/cdi/{KIND}replaced.json").exists()
        # As if a kill had also hit the middle of an atomic write:
        (root / f"var/run/cdi/.{KIND}claim_y.json.deadbeef.tmp").write_text("{")
        (root / "var/lib/hostagent/.allocations.json.deadbeef.tmp").write_text("{")
        agent.env = {}
        agent.start()
        listed = assert_consistent(agent)          # the replaced one's spec too: removed if released
        assert listed == ({"before", "claim/x"} if survives else {"before", "replaced"})
        # The plugin retries the same request: it succeeds (created, or the committed one).
        with agent.client() as c:
            again = c.allocate("claim/x", ["1", "2"], replaces=["replaced"])
            assert len(again["devices"]) == 2
        assert_consistent(agent)


@pytest.mark.parametrize("point, committed", [("checkpoint:mid_line", False), ("write:allocations.json", False),
                                              ("checkpoint:after_snapshot", True)])
def test_kill9_in_the_middle_of_a_checkpoint_write(point, committed):
    """kill -9 half-way through a journal line, in a compaction's write before its rename,
    and after its snapshot before the journal's emptying: nothing lost, nothing invented
    (an allocation released and made again since, whose release is still in the journal,
    is kept), no litter, and the checkpoint read whole (a cut line is no damage)."""
    root = make_root()
    with running_agent(root) as agent:
        with agent.client() as c:
            c.allocate("kept", ["0"])                           # the snapshot
            c.allocate("again", ["1"])                          # journal lines
            c.release("again")
        agent.stop()
        agent.env = {"HOSTAGENT_FAULT": f"{point}=stop"}
        agent.start()
        with agent.client() as c:
            if point == "checkpoint:mid_line":
                c.allocate("warm", ["3"])                       # a start's first save is a snapshot
            caller = threading.Thread(target=lambda: _ignore_errors(lambda: c.allocate("again", ["2"])))
            caller.start()
            until(lambda: _stopped(agent.proc.pid), what=f"the agent held at {point}")
            if point == "write:allocations.json":               # the kill lands inside the write
                assert list((root / "var/lib/hostagent").glob(".allocations.json.*.tmp")), os.listdir(root / "var/lib/hostagent")
            if point == "checkpoint:mid_line":
                assert not checkpoint.journal_path(agent.host).read_bytes().endswith(b"\n")
            agent.kill()
            caller.join(30)
        agent.env = {}
        agent.start()
        listed = assert_consistent(agent)
        before = {"kept", "warm"} if point == "checkpoint:mid_line" else {"kept"}
        assert listed == (before | {"again"} if committed else before)
        with agent.client() as c:
            assert c.node()["checkpoint"]["state"] == "ok"
            if committed:
                assert c.allocation("again")["devices"] == [c.device("2")["uuid"]]
            c.allocate("again", ["2"])                          # the retry: made, or the one committed
        assert_consistent(agent)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _ignore_errors(fn) -> None:
    try:
        fn()
    except HostagentError:
        pass


@pytest.mark.parametrize("point", ["release:after_checkpoint", "release:after_spec"])
def test_crash_while_releasing(point):
    root = make_root()
    with running_agent(root) as agent:
        with agent.client() as c:
            c.allocate("gone-soon", ["3"])
            c.allocate("stays", ["4"])
        agent.stop()
        agent.env = {"HOSTAGENT_FAULT": point}
        agent.start()
        crash_during(agent, lambda c: c.release("gone-soon"))
        leaked = point == "release:after_checkpoint"
        assert (root / f"var/run/cdi/{KIND}gone-soon.json").exists() == leaked   # the spec leaked...
        agent.env = {}
        agent.start()
        assert assert_consistent(agent) == {"stays"}                      # ...until the restart
        assert ("removed transient spec" in agent.log()) == leaked
        with agent.client() as c:                                         # the plugin's retry
            assert c.release("gone-soon", missing_ok=True) is None


MODES = {"version": "v1", "mig-configs": {"modes": [{"devices": [0], "mig-enabled": True, "mig-devices": {}},
                                                   {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]}}


@GPU_CHANGES
def test_a_crash_between_a_releases_commit_and_its_tear_down_is_finished_at_the_next_start():
    """The release is committed first, then its MPS daemon stopped and its MIG device
    destroyed: killed in between, the next start does both (the daemon has no allocation,
    the device is in the release's record)."""
    from hostagent.processes import ProcessRecord, current
    root = make_root()
    with running_agent(root) as agent:
        with agent.client(timeout=None) as c:
            c.mig_apply("modes", spec=MODES)
            a = c.allocate("claim", [{"mig": {"gpu": "0", "profile": "2g.10gb", "start": 0},
                                      "sharing": {"strategy": "MPS"}}], own_mps_daemon=True)
        daemon, [mig] = ProcessRecord.from_dict(a["mps"]["process"]), a["devices"]
        agent.stop()
        agent.env = {"HOSTAGENT_FAULT": "release:after_checkpoint"}
        agent.start()
        crash_during(agent, lambda c: c.release("claim"))
        assert current(daemon) and (agent.host.state_dir / "allocation-releasing.json").exists()
        agent.env = {}
        agent.start()
        assert assert_consistent(agent) == set()
        with agent.client() as c:
            assert mig not in {m["uuid"] for m in c.devices(type="mig")["mig_devices"]}
        assert not current(daemon) and not (agent.host.state_dir / "allocation-releasing.json").exists()
        assert "MIG devices of released allocation(s) claim destroyed after a crash (1)" in agent.log()
        assert f"MPS daemon {a['mps']['key']} stopped: no allocation has it" in agent.log()


def test_node_named_allocation_survives_a_crash_without_a_spec():
    """An allocation answered with the node spec's names has no spec: the checkpoint alone
    is its commit point and its record across a crash."""
    root = make_root()
    agent = AgentProcess(root)
    agent.env = {"HOSTAGENT_FAULT": "allocate:after_checkpoint"}
    agent.start()
    try:
        crash_during(agent, lambda c: c.allocate("node/x", ["1"], cdi_names="node"))
        stray = root / f"var/run/cdi/{KIND}node_x.json"          # none of its own: removed
        stray.write_text("{}")
        agent.env = {}
        agent.start()
        with agent.client() as c:
            [alloc] = c.allocations()
            gpu = c.device("1")
            assert alloc["id"] == "node/x" and alloc["devices"] == [gpu["uuid"]]
            assert alloc["cdi_devices"] == [f"nvidia.com/gpu={gpu['uuid']}"] and alloc["spec_path"] is None
            assert c.allocate("node/x", ["1"], cdi_names="node") == alloc       # the plugin's retry
        assert not stray.exists() and not list((root / "var/run/cdi").glob(KIND + "*"))
        assert [a.request.get("cdi_names") for a in checkpoint.read(agent.host)] == ["node"]
    finally:
        agent.stop()
        agent.cleanup()


def test_random_kill9_under_load():
    """A client allocates and releases as fast as it can; the daemon is killed at random
    moments. Every allocation the client was told about survives unless it was released;
    none it was not told about appears except one whose answer the kill swallowed."""
    rng = random.Random(6)
    root = make_root()
    agent = AgentProcess(root).start()
    confirmed: set[str] = set()
    try:
        for round_ in range(4):
            uncertain: set[str] = set()
            stop = threading.Event()

            def churn():
                i = 0
                with agent.client(timeout=5) as c:
                    while not stop.is_set():
                        i += 1
                        name = f"r{round_}-{i}"
                        try:
                            if confirmed and rng.random() < 0.4:
                                victim = sorted(confirmed)[0]
                                uncertain.add(victim)
                                c.release(victim)
                                confirmed.discard(victim)
                                uncertain.discard(victim)
                            else:
                                uncertain.add(name)
                                c.allocate(name, [{"constraints": {"type": "gpu"}}],
                                           sharing={"strategy": "TimeSlicing"})
                                confirmed.add(name)
                                uncertain.discard(name)
                        except HostagentError:
                            return
            t = threading.Thread(target=churn)
            t.start()
            time.sleep(rng.uniform(0.2, 0.6))
            agent.kill()
            stop.set()
            t.join(10)
            agent.start()
            listed = assert_consistent(agent)
            assert confirmed - uncertain <= listed, confirmed - listed
            assert listed <= confirmed | uncertain
            confirmed = listed
        assert confirmed
    finally:
        agent.stop()
        agent.cleanup()


def test_client_leaving_mid_request_does_not_split_state():
    """A plugin that sends an allocation and hangs up at once (a kubelet timeout): the
    allocation still completes in memory and on disk, or not at all."""
    import socket as sk
    root = make_root()
    with running_agent(root) as agent:
        for i in range(20):
            body = json.dumps({"id": f"gone-{i}", "devices": [{"device": str(i % 8)}],
                               "sharing": {"strategy": "TimeSlicing"}}).encode()
            with sk.socket(sk.AF_UNIX) as s:
                s.connect(str(agent.socket))
                s.sendall(b"POST /v1/allocations HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        # Each completes after its client left: wait for all (not for a fixed time, which a
        # busy host can overrun), then compare memory and disk.
        with agent.client() as c:
            until(lambda: len(c.allocations()) >= 20, 30, c.allocations)
        listed = assert_consistent(agent)
        assert listed == {f"gone-{i}" for i in range(20)}
