"""Sharing in the daemon: the API, events, supervision of real MPS daemons (restart after a
death or a hang, with back-off), adoption across an agent restart, MIG changes."""

import json
import os
import signal
import stat
import subprocess
import time

import pytest

from hostagent.errors import HostagentError
from hostagent.plugins.resources import node_resources, strategy_from_labels
from hostagent.sharing import mps
from tests.waiting import until

from .agentd import FAST, AgentProcess, make_root, running_agent
from .mpsprocs import alive, daemon_pid, running

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="compute modes and MPS daemons need root "
                                "(nvml.h: Requires root/admin permissions); CI runs as root")

CONFIG = {"version": "v1", "sharing": {
    "mps": {"resources": [{"name": "nvidia.com/gpu", "devices": [0, 1], "replicas": 4}]},
    "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "devices": [2], "replicas": 2, "interval": "Long"}]}}}
SUPERVISION = {**FAST, "sharing": {"probe_interval": 0.5, "probe_timeout": 2, "restart_backoff": 0.2,
                                   "restart_backoff_max": 1}}


@pytest.fixture(scope="module")
def agent():
    with running_agent(make_root("dgx-a100"), SUPERVISION) as proc:
        yield proc
    assert running(proc.root) == []


def daemon(c, name):
    return next(d for d in c.sharing()["devices"] if d["name"] == name)["mps"]


def restarts_counted(c, uuid) -> float:
    """hostagent_mps_daemon_restarts_total of the device (0 before its first restart)."""
    prefix = f'hostagent_mps_daemon_restarts_total{{device="{uuid}"}} '
    return next((float(line[len(prefix):]) for line in c.metrics().splitlines() if line.startswith(prefix)), 0.0)


def test_apply_through_the_api_publishes_devices_and_events(agent):
    with agent.client() as c:
        rev = c.node()["revision"]
        out = c.sharing_apply(CONFIG)
        assert out["report"]["failed"] == 0 and not out["dry_run"]
        status = c.sharing()
        assert status["config"]["document"] == CONFIG and status["strategies"] == ["mps", "time-slicing"]
        d0 = daemon(c, "0")
        assert d0["state"] == "ready" and d0["pid"] == daemon_pid(agent.host, c.device("0")["uuid"])
        dev0, dev2, dev3 = c.device("0"), c.device("2"), c.device("3")
        assert dev0["replicas"] == [f"{dev0['uuid']}::{i}" for i in range(4)]
        assert dev0["sharing"]["strategy"] == "mps" and dev0["sharing"]["mps"]["state"] == "ready"
        assert dev2["sharing"]["interval"] == "Long" and len(dev2["replicas"]) == 2
        assert dev3["sharing"] is None and dev3["replicas"] == [dev3["uuid"]]
        events = []
        for event in c.watch(since=rev):
            events.append(event)
            if event["type"] == "sharing_changed":
                break
        assert events[-1]["reason"] == "applied" and events[-1]["sharing"]["devices"][0]["name"] == "0"
        # Bad input: one error, nothing changed.
        with pytest.raises(HostagentError) as e:
            c.sharing_apply({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 99}]}}})
        assert e.value.status == 400 and e.value.code == "invalid_config" and "99 replicas is more than the 48 MPS clients" in e.value.message
        with pytest.raises(HostagentError) as e:
            c.request("PUT", "/v1/sharing", {"config": {}, "bogus": True})
        assert e.value.code == "invalid_argument"
        assert c.sharing()["config"]["document"] == CONFIG
        dry = c.sharing_apply(None, dry_run=True)
        assert dry["dry_run"] and any(s["action"] == "stop_daemon" for s in dry["plan"]["steps"])
        assert daemon(c, "1")["state"] == "ready"


def test_a_dead_or_hung_daemon_is_restarted(agent):
    with agent.client() as c:
        assert c.sharing_apply(CONFIG)["report"]["failed"] == 0      # whatever ran before: this configuration
        uuid = c.device("0")["uuid"]
        counted = restarts_counted(c, uuid)
        before = daemon(c, "0")
        os.kill(before["pid"], signal.SIGKILL)
        after = until(lambda: (d := daemon(c, "0"))["state"] == "ready" and d["pid"] != before["pid"] and d,
                      what="restart after SIGKILL")
        assert after["restarts"] == before["restarts"] + 1 and mps.probe(agent.host, uuid)
        os.kill(after["pid"], signal.SIGSTOP)            # alive, but answers nothing
        try:
            again = until(lambda: (d := daemon(c, "0"))["state"] == "ready" and d["pid"] != after["pid"] and d,
                          timeout=20, what="restart of a hung daemon")
        finally:
            try:
                os.kill(after["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert again["restarts"] == after["restarts"] + 1
        assert not alive(after["pid"])               # the hung one was killed, not left beside
        assert restarts_counted(c, uuid) == counted + 2
        assert f'hostagent_mps_daemon_up{{device="{uuid}"}} 1.0' in c.metrics()


def test_a_pipe_directory_a_client_wrote_moves_nothing(agent):
    """What a container could do to a pipe directory it could write (containers given the
    daemon's pipe directory read-write, as MPS clients of other plugins are): a host pid in
    the pid file, then the pid file made a FIFO, and the socket removed. The agent signals
    no process but the daemon it recorded (checked first), never blocks on the FIFO, keeps
    answering, and restarts the daemon in a new pipe directory."""
    victim = subprocess.Popen(["sleep", "120"])
    try:
        with agent.client() as c:
            c.sharing_apply(CONFIG)
            uuid = c.device("0")["uuid"]
            for attack in ("pid", "fifo"):
                before = daemon(c, "0")
                assert before["state"] == "ready"
                pid_file, socket_file = (mps.pipe_dir(agent.host, uuid) / name
                                         for name in ("nvidia-cuda-mps-control.pid", "control"))
                if attack == "pid":
                    pid_file.write_text(f"{victim.pid}\n")
                else:
                    pid_file.unlink()
                    os.mkfifo(pid_file)
                socket_file.unlink()
                after = until(lambda: (d := daemon(c, "0"))["state"] == "ready" and d["pid"] != before["pid"] and d,
                              timeout=20, what=f"a restart after the {attack} attack")
                assert victim.poll() is None and not alive(before["pid"])
                assert after["pid"] == daemon_pid(agent.host, uuid) and mps.probe(agent.host, uuid)
                assert not stat.S_ISFIFO(os.lstat(mps.pipe_dir(agent.host, uuid) / "nvidia-cuda-mps-control.pid").st_mode)
            pid_file.write_text(f"{victim.pid}\n")
            started = time.monotonic()
            c.sharing_apply(None)
            assert time.monotonic() - started < 15 and victim.poll() is None
            assert running(agent.root) == []
            c.sharing_apply(CONFIG)
    finally:
        victim.kill()
        victim.wait()


def test_a_restarted_agent_adopts_its_daemons(agent):
    with agent.client() as c:
        assert c.sharing_apply(CONFIG)["report"]["failed"] == 0
        pids = {n: daemon(c, n)["pid"] for n in ("0", "1")}
    assert agent.stop() == 0
    assert all(alive(p) for p in pids.values())        # the daemons outlive the agent
    agent.start()
    with agent.client() as c:
        assert {n: daemon(c, n)["pid"] for n in ("0", "1")} == pids
        assert daemon(c, "0")["state"] == "ready"
    assert "MPS daemon of GPU 0 adopted" in agent.log()


def test_allocations_of_shared_devices(agent):
    """Replicas are what a device plugin allocates: each held once, MPS clients get the
    daemon's pipe, the shared /dev/shm and the limits in their CDI spec and plain edits."""
    from hostagent.cdi.validate import validate_spec
    config = {"version": "v1", "sharing": {
        "mps": {"resources": [{"name": "gpu", "devices": [1], "replicas": 2, "pinnedMemoryLimit": "8Gi"}]},
        "timeSlicing": {"failRequestsGreaterThanOne": False,
                        "resources": [{"name": "gpu", "devices": [2], "replicas": 3}]}}}
    with agent.client() as c:
        c.sharing_apply(config)
        try:
            g1, g2 = c.device("1"), c.device("2")
            a = c.allocate("pod-a", [g1["replicas"][1]])
            assert (a["devices"], a["replicas"], a["sharing"]["strategy"]) == ([g1["uuid"]], [f"{g1['uuid']}::1"], "MPS")
            env = a["container_edits"]["env"]
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in env
            mounts = {m["containerPath"]: m for m in a["container_edits"]["mounts"]}
            # The daemon's socket alone, read-only: never its pipe directory.
            client = mps.client_dir(agent.host, g1["uuid"])
            assert mounts["/tmp/nvidia-mps"]["hostPath"] == str(client) and "ro" in mounts["/tmp/nvidia-mps"]["options"]
            assert os.listdir(client) == ["control"]
            assert os.stat(client / "control").st_ino == os.stat(mps.pipe_dir(agent.host, g1["uuid"]) / "control").st_ino
            assert mounts["/dev/shm"]["hostPath"] == str(mps.shm_dir(agent.host))
            spec = json.loads(open(a["spec_path"]).read())
            validate_spec(spec)
            (device,) = spec["devices"]
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in device["containerEdits"]["env"]
            assert {m["containerPath"] for m in device["containerEdits"]["mounts"]} >= {"/tmp/nvidia-mps", "/dev/shm"}
            # The same replica twice, then the other one by plain name, then none is left.
            with pytest.raises(HostagentError) as e:
                c.allocate("pod-b", [g1["replicas"][1]])
            assert e.value.code == "device_busy" and e.value.details["allocations"] == ["pod-a"]
            b = c.allocate("pod-b", ["1"], sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}})
            assert b["replicas"] == [f"{g1['uuid']}::0"] and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20" in b["container_edits"]["env"]
            with pytest.raises(HostagentError) as e:
                c.allocate("pod-c", ["1"])
            assert e.value.code == "device_busy"
            c.release("pod-b")
            # failRequestsGreaterThanOne: MPS's default refuses two replicas; time-slicing here allows them.
            with pytest.raises(HostagentError) as e:
                c.allocate("pod-d", g1["replicas"][:1] + g2["replicas"][:1])
            assert e.value.code == "sharing_mismatch"
            t = c.allocate("pod-t", g2["replicas"][:2])
            assert t["replicas"] == g2["replicas"][:2] and t["sharing"]["strategy"] == "TimeSlicing"
            assert not any(e.startswith("CUDA_MPS") for e in t["container_edits"]["env"])
            with pytest.raises(HostagentError) as e:
                c.allocate("pod-m", ["3"], sharing={"strategy": "MPS"})
            assert e.value.code == "device_not_allocatable" and "not shared with MPS" in e.value.message
            # Devices in use keep their sharing.
            with pytest.raises(HostagentError) as e:
                c.sharing_apply(None)
            assert e.value.code == "device_busy" and sorted(e.value.details["allocations"]) == ["pod-a", "pod-t"]
            assert c.device("1")["allocations"] == ["pod-a"]
        finally:
            for alloc in c.allocations():
                c.release(alloc["id"])
        c.sharing_apply(CONFIG)


def test_a_clients_pinned_limit_is_at_most_the_devices_memory(agent):
    """What an allocation asks of the node's MPS daemon's clients is bounded as the node's
    configuration is: a limit past the device's memory (accepted, whatever its size, and
    taken as a lower one only where the node's own limit was lower) is refused."""
    with agent.client() as c:
        assert c.sharing_apply(CONFIG)["report"]["failed"] == 0      # GPU 0 shared with MPS, no limit of its own
        memory = c.device("0")["memory_mib"]
        for limits in ({"defaultPinnedDeviceMemoryLimit": f"{memory + 1}Mi"},
                       {"defaultPinnedDeviceMemoryLimit": "99999999999999999999Gi"},
                       {"defaultPerDevicePinnedMemoryLimit": {"0": f"{memory * 2}Mi"}}):
            with pytest.raises(HostagentError) as e:
                c.allocate("pod-big", ["0"], sharing={"strategy": "MPS", "mpsConfig": limits})
            assert e.value.code == "invalid_argument" and "is more than its memory" in e.value.message, e.value.message
        assert c.allocations() == []
        a = c.allocate("pod-all", ["0"], sharing={"strategy": "MPS",
                                                  "mpsConfig": {"defaultPinnedDeviceMemoryLimit": f"{memory}Mi"}})
        try:
            node_limit = memory // 4                                   # the daemon's: its memory over 4 replicas
            assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={node_limit}M" in a["container_edits"]["env"]
        finally:
            c.release("pod-all")


@pytest.mark.parametrize("strategies", [("envvar",), ("cdi-cri",), ("cdi-cri", "envvar"), ("edits",)])
def test_the_device_plugin_connects_an_mps_replica_to_its_daemon_whatever_its_strategy(agent, strategies):
    """NVIDIA's plugin adds the MPS pipe, /dev/shm and the variable whatever its device list
    strategy: so does this one, from the allocation's edits when no CDI name carries them."""
    from hostagent.plugins.agentlink import AgentLink, NodeView
    from hostagent.plugins.allocations import Allocations
    link = AgentLink(agent.socket)
    with agent.client() as c:
        c.sharing_apply(CONFIG)
        gpu = c.device("0")                        # MPS, 4 replicas
        link.view = NodeView(connected=True, devices={gpu["uuid"]: gpu})
        replica = gpu["replicas"][2]
        r = Allocations(link, strategies).allocate("nvidia.com/gpu", [replica], {replica: gpu["uuid"]})
        try:
            pipe = str(mps.client_dir(agent.host, gpu["uuid"]))   # the socket's folder, read-only
            if "cdi-cri" in strategies:            # the allocation's own spec says it all
                [alloc] = [a for a in c.allocations() if a["replicas"] == [replica]]
                assert [d.name for d in r.cdi_devices] == alloc["cdi_devices"] and not r.mounts
                spec = json.loads(open(alloc["spec_path"]).read())
                assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in spec["devices"][0]["containerEdits"]["env"]
            else:
                assert r.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
                assert r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
                mounts = {m.container_path: m for m in r.mounts}
                assert mounts["/tmp/nvidia-mps"].host_path == pipe and mounts["/tmp/nvidia-mps"].read_only
                assert mounts["/dev/shm"].host_path == str(mps.shm_dir(agent.host))
                assert ("NVIDIA_VISIBLE_DEVICES" in r.envs) == ("envvar" in strategies or "edits" in strategies)
        finally:
            for a in c.allocations():
                c.release(a["id"])


def test_an_apply_killed_half_way_is_rolled_back_at_the_agents_start(tmp_path):
    """Killed (-9) once it stopped the daemons of the configuration in force: the agent's
    start brings that configuration back and removes the journal, and its log says so."""
    import sys
    from hostagent.sharing.journal import SharingJournal
    root = make_root("dgx-a100")
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("sharing:\n  mps:\n    resources:\n    - {name: gpu, devices: [0, 1], replicas: 2}\n")
    second.write_text("sharing:\n  mps:\n    resources:\n    - {name: gpu, devices: [2], replicas: 2}\n")
    cli = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "sharing", "apply", "-f"]
    with running_agent(root, SUPERVISION, start=False) as agent:
        subprocess.run([*cli, str(first)], check=True, capture_output=True, timeout=120)
        killed = subprocess.run([*cli, str(second)], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "HOSTAGENT_FAULT": "sharing:after_stops"})
        assert killed.returncode == -9, killed.stderr
        assert running(root) == [] and SharingJournal.path(agent.host).exists()
        agent.start()
        with agent.client() as c:
            until(lambda: [d["name"] for d in c.sharing()["devices"] if d["mps"]["state"] == "ready"] == ["0", "1"],
                  timeout=30, what=lambda: f"the first configuration's daemons: {c.sharing()['devices']}")
            assert daemon_pid(agent.host, c.device("2")["uuid"]) is None
        assert not SharingJournal.path(agent.host).exists()
        assert "sharing: rolled back the sharing apply started " in agent.log()
        with agent.client() as c:
            c.sharing_apply(None)


def test_numbers_without_a_fraction_and_unknown_keys_through_the_api(agent):
    """A JSON body's 2.0 is 2, as in a file; a key the agent does not know is a warning."""
    doc = {"version": "v1", "newerPluginKey": 1,
           "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2.0, "devices": 1.0}]}}}
    with agent.client() as c:
        out = c.sharing_apply(doc, dry_run=True)
    assert out["warnings"] == ["(top level): unknown key 'newerPluginKey', ignored (as the device plugin ignores it)"]
    assert [d["replicas"] for d in out["plan"]["devices"].values() if d["strategy"] == "time-slicing"] == [2]


def test_off_through_the_api(agent):
    with agent.client() as c:
        out = c.sharing_apply(None)
        assert out["report"]["failed"] == 0
        assert c.sharing()["devices"] == [] and c.device("0")["sharing"] is None
    assert running(agent.root) == [] and not os.path.ismount(mps.shm_dir(agent.host))


def test_mps_on_mig_devices_follows_a_mig_change():
    """MPS daemons serve MIG devices; a MIG change stops the daemons of the devices it takes
    away (and only those: a sibling's daemon and its server go on), and the devices the
    configuration names afterwards get daemons."""
    root = make_root("hgx-h100")                         # Hopper: MIG mode applies at once
    import subprocess
    smi = str(root / "usr/bin/nvidia-smi")
    subprocess.run([smi, "-i", "0", "-mig", "1"], check=True, capture_output=True)
    subprocess.run([smi, "mig", "-i", "0", "-cgi", "1g.10gb,1g.10gb", "-C"], check=True, capture_output=True)
    with running_agent(root, SUPERVISION) as agent:
        with agent.client(timeout=60) as c:
            out = c.sharing_apply({"flags": {"migStrategy": "mixed"}, "sharing": {"mps": {"resources": [
                {"name": "nvidia.com/mig-1g.10gb", "replicas": 2, "activeThreadPercentage": 40}]}}})
            assert out["report"]["failed"] == 0
            migs = c.devices(type="mig")["mig_devices"]
            assert [d["sharing"]["mps"]["state"] for d in migs] == ["ready", "ready"]
            # The file's flags.migStrategy is the labels' strategy, and so the device plugin's.
            labels = c.labels()["labels"]
            assert labels["nvidia.com/mig.strategy"] == "mixed"
            views = {d["uuid"]: d for d in (*c.devices()["gpus"], *migs)}
            resources, _ = node_resources(views, strategy_from_labels(labels))
            assert len(resources["nvidia.com/mig-1g.10gb"]) == 4 and len(resources["nvidia.com/gpu"]) == 7
            keep, gone = migs[0], migs[1]
            env = mps.environment(agent.host, keep["uuid"])
            server = subprocess.run([str(root / "usr/bin/nvidia-cuda-mps-control")], input="start_server -uid 0\n"
                                    "get_server_list\n", env=env, capture_output=True, text=True).stdout.split()[-1]
            keep_pid = keep["sharing"]["mps"]["pid"]
            spec = {"version": "v1", "mig-configs": {"one": [{"devices": [0], "mig-enabled": True,
                                                             "mig-devices": {"1g.10gb": 1}}]}}
            plan = c.mig_apply("one", spec=spec, dry_run=True)
            assert any("would stop" in p["message"] for p in plan["progress"]), plan["progress"]
            result = c.mig_apply("one", spec=spec)
            stopped = [p["message"] for p in result["progress"] if "MPS daemons" in p["message"]]
            assert stopped == [f"MPS daemons of MIG device {gone['name']} stopped for the MIG change"], result["progress"]
            (left,) = c.devices(type="mig")["mig_devices"]
            assert left["uuid"] == keep["uuid"] and left["sharing"]["mps"]["pid"] == keep_pid
            assert alive(int(server))                      # its client's server was never touched
            assert [d["name"] for d in c.sharing()["devices"]] == [keep["name"]]
            assert not mps.daemon_dir(agent.host, gone["uuid"]).exists()
            # A bigger layout: the new 1g.10gb devices get daemons of their own.
            spec = {"version": "v1", "mig-configs": {"three": [{"devices": [0], "mig-enabled": True,
                                                               "mig-devices": {"1g.10gb": 3}}]}}
            c.mig_apply("three", spec=spec)
            shared = c.sharing()["devices"]
            assert len(shared) == 3 and {d["mps"]["state"] for d in shared} == {"ready"}
            assert {d["active_thread_percentage"] for d in shared} == {40}
            c.sharing_apply(None)
            assert "nvidia.com/mig.strategy" not in c.labels()["labels"]         # none again
        assert running(root) == []


def test_labels_follow_the_sharing_in_force(agent):
    """GFD's keys from what is shared now: replicas, strategy, -SHARED, mps.capable."""
    P = "nvidia.com/"
    with agent.client() as c:
        c.sharing_apply(CONFIG)
        labels = c.labels()["labels"]
        assert labels[P + "gpu.sharing-strategy"] == "mps" and labels[P + "gpu.replicas"] == "4"
        assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED" and labels[P + "mps.capable"] == "true"
        renamed = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
            {"name": "gpu", "replicas": 6, "devices": [2, 3]}]}}}
        c.sharing_apply(renamed)
        labels = c.labels()["labels"]
        assert labels[P + "gpu.sharing-strategy"] == "time-slicing" and labels[P + "gpu.replicas"] == "6"
        assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB" and labels[P + "mps.capable"] == "false"
        written = (agent.root / "etc/kubernetes/node-feature-discovery/features.d/hostagent").read_text()
        assert f"{P}gpu.replicas=6\n" in written
        c.sharing_apply(CONFIG)


def test_a_driver_install_stops_the_daemons_until_the_driver_verifies(agent):
    """The driver's maintenance (driver install) closes the gate: the daemons stop (their
    servers would keep the modules from unloading) and wait, saying why; they start again
    once the driver verifies."""
    with agent.client() as c:
        c.sharing_apply(CONFIG)
        before = daemon(c, "0")["pid"]
        c.request("POST", "/v1/driver/maintenance", {"pid": os.getpid(), "operation": "test install"})
        try:
            status = c.sharing()
            assert status["waiting"] and "the driver is being changed (test install" in status["waiting"]
            assert {d["mps"]["state"] for d in status["devices"] if d["mps"]} == {"waiting"}
            assert running(agent.root) == [] and not alive(before)
            with pytest.raises(HostagentError) as e:
                c.sharing_apply(CONFIG)
            assert e.value.code == "unavailable" and "the driver is being changed" in e.value.message
        finally:
            c.request("DELETE", "/v1/driver/maintenance")
        after = until(lambda: (d := daemon(c, "0"))["state"] == "ready" and d, what="daemons after the driver")
        assert after["pid"] != before and c.sharing()["waiting"] is None
    assert "MPS daemons of GPU 0, GPU 1 stopped: driver maintenance" in agent.log()


def test_supervision_stays_out_of_a_change_under_way():
    """Daemons that an apply or an off stops are not 'down': supervision (every 0.1 s here)
    leaves them to the change, and what the API answers after the change is the change's."""
    proc = AgentProcess(make_root("dgx-a100"), {**SUPERVISION, "sharing": {**SUPERVISION["sharing"],
                                                                            "probe_interval": 0.1}})
    proc.start()
    try:
        with proc.client() as c:
            for _ in range(4):
                assert c.sharing_apply(CONFIG)["report"]["failed"] == 0
                assert c.device("0")["sharing"]["mps"]["state"] == "ready"
                assert c.sharing_apply(None)["report"]["failed"] == 0
                assert c.sharing()["devices"] == [] and c.device("0")["sharing"] is None
        assert "down:" not in proc.log() and "restarting in" not in proc.log(), proc.log()
    finally:
        proc.stop()
        proc.cleanup()
        assert running(proc.root) == []
