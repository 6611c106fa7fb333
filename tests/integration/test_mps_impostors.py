"""MPS daemons beside impostors: processes of a user in no group that run the node's control
binary with ``-d`` and a daemon's pipe folder in their environment, as any local user (or a
container given the host's binary) can. The agent knows its daemons from what it started:
impostors block no start, and are never signalled."""

import json
import os

import pytest

from hostagent.sharing import mps
from hostagent.sim.store import SimStore
from tests.rootneeds import GPU_CHANGES

from .agentd import FAST, make_root, running_agent
from .impostor import NOBODY, Impostors
from .mpsprocs import daemon_pid, on_pipe, running

pytestmark = [GPU_CHANGES, pytest.mark.root("impostors are processes root starts as nobody")]

MPS_0_2 = {"version": "v1", "sharing": {
    "mps": {"resources": [{"name": "nvidia.com/gpu", "devices": [0, 1, 2], "replicas": 4}]}}}
MPS_50 = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}


@pytest.fixture
def agent():
    with running_agent(make_root("dgx-a100"), FAST) as proc:
        yield proc
    assert running(proc.root) == []


def daemon(c, name):
    return next(d for d in c.sharing()["devices"] if d["name"] == name)["mps"]


def test_impostors_on_a_pipe_folder_block_no_start_and_are_never_signalled(agent):
    with agent.client() as c:
        gpu2 = c.device("2")["uuid"]
        with Impostors(mps.control_tool(agent.host), mps.pipe_dir(agent.host, gpu2)) as impostors:
            held = impostors.hold(2)
            impostors.loop()
            assert set(held) <= set(on_pipe(agent.host, gpu2))            # they look like daemons
            assert all(os.stat(f"/proc/{p}").st_uid == NOBODY for p in held)
            out = c.sharing_apply(MPS_0_2)
            assert out["report"]["failed"] == 0 and out["rolled_back"] is None, out["report"]
            for name in ("0", "1", "2"):
                d = daemon(c, name)
                assert d["state"] == "ready" and d["pid"] not in held
            assert daemon(c, "2")["pid"] == daemon_pid(agent.host, gpu2)   # root's, the one recorded
            assert mps.probe(agent.host, gpu2)
            # A restart of the agent adopts its own daemons; turning sharing off stops them alone.
            pid = daemon(c, "2")["pid"]
            agent.stop()
            agent.start()
            assert "MPS daemon of GPU 2 adopted" in agent.log() and daemon(c, "2")["pid"] == pid
            assert c.sharing_apply(None)["report"]["failed"] == 0
            assert daemon_pid(agent.host, gpu2) is None
            assert impostors.signalled() == [] and set(held) <= set(on_pipe(agent.host, gpu2))


def test_an_allocations_daemon_and_its_orphan_stop_leave_impostors_and_other_gpus_be(agent):
    """An impostor on an allocation daemon's pipe folder blocks neither its start nor its
    stop; and stopping a daemon a crash left without its allocation sets back the GPUs its
    own record names, not those an impostor's environment names (GPU 3, another claim's)."""
    from hostagent.daemon import checkpoint
    from hostagent.daemon.claimmps import key
    with agent.client() as c:
        other = c.allocate("claim-other", [{"device": "3", "sharing": MPS_50}], own_mps_daemon=True)
        gpu3 = other["mps"]["devices"][0]
        name = key("claim-left")
        with Impostors(mps.control_tool(agent.host), mps.pipe_dir(agent.host, name),
                       env={"CUDA_VISIBLE_DEVICES": gpu3}) as impostors:
            held = impostors.hold(1)
            impostors.loop()
            left = c.allocate("claim-left", [{"device": "4", "sharing": MPS_50}], own_mps_daemon=True)
            assert left["mps"]["key"] == name and left["mps"]["process"]["pid"] not in held
            agent.stop()
            # What a crash between the daemon's start and the allocation's commit leaves.
            kept = [a.checkpoint() for a in checkpoint.read(agent.host) if a.id != "claim-left"]
            checkpoint.path(agent.host).write_text(json.dumps({"version": checkpoint.VERSION, "allocations": kept}))
            checkpoint.journal_path(agent.host).unlink(missing_ok=True)
            agent.start()
            assert f"MPS daemon {name} stopped: no allocation has it" in agent.log()
            gpus = SimStore(agent.root).read().gpus
            assert gpus[4].compute_mode == 0 and gpus[3].compute_mode == 3        # DEFAULT; EXCLUSIVE_PROCESS
            assert daemon_pid(agent.host, name) is None and impostors.signalled() == []
            assert set(held) <= set(on_pipe(agent.host, name))
        assert c.allocation("claim-other")["mps"] == other["mps"]
        c.release("claim-other")
