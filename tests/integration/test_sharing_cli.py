"""``hostagent sharing`` without the daemon, against real processes: the simulated driver's
MPS control daemons, nvidia-smi and NVML."""

import json
import os
import subprocess
import sys
import sysconfig
import time

import pytest

from hostagent.cli.main import main
from hostagent.devices import nvml_session, read_inventory
from hostagent.devices.computectl import ComputeControl
from hostagent.sharing import mps
from hostagent.sharing.journal import SharingJournal

from .mpsprocs import daemon_pid, running, stop_all

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="compute modes and MPS daemons need root "
                          "(nvml.h: Requires root/admin permissions); CI runs as root")

CONFIG = """version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      devices: [0, 1]
      replicas: 4
      activeThreadPercentage: 30
  timeSlicing:
    resources:
    - name: gpu
      devices: [2]
      replicas: 3
      interval: Short
"""


@pytest.fixture
def node(make_node, tmp_path):
    host, store = make_node("dgx-a100")
    cfg = tmp_path / "sharing.yaml"
    cfg.write_text(CONFIG)
    yield host, cfg
    assert stop_all(host.root) == [], "a test left MPS daemons running"


def run(capsys, host, *args):
    try:
        code = main(["--simulate", str(host.root), "sharing", *map(str, args)])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def modes(host):
    inv = read_inventory(host)
    with nvml_session(host):
        return [ComputeControl().mode(g.uuid) for g in inv.gpus]


def smi(host, *args):
    return subprocess.run([str(host.driver("usr/bin/nvidia-smi")), *args], capture_output=True, text=True).stdout


@ROOT
def test_apply_status_off(node, capsys):
    host, cfg = node
    code, out, err = run(capsys, host, "apply", "-f", cfg, "--dry-run")
    assert code == 0 and "GPU 0: start its MPS control daemon (30% active threads" in out
    assert "dry run: nothing was changed" in err and running(host.root) == []
    assert not (host.root / "etc/hostagent/sharing.yaml").exists() and modes(host)[0] == "DEFAULT"

    code, out, err = run(capsys, host, "apply", "-f", cfg)
    assert code == 0, out + err
    inv = read_inventory(host)
    u0, u1 = inv.gpus[0].uuid, inv.gpus[1].uuid
    assert modes(host)[:3] == ["EXCLUSIVE_PROCESS", "EXCLUSIVE_PROCESS", "DEFAULT"]
    assert "Timeslice: Short" in smi(host, "compute-policy", "-l", "-i", "2")
    assert (host.root / "etc/hostagent/sharing.yaml").exists()
    for uuid in (u0, u1):
        pid = daemon_pid(host, uuid)
        assert pid is not None and mps.probe(host, uuid)
        env = dict(v.split("=", 1) for v in open(f"/proc/{pid}/environ").read().split("\0") if v)
        # A clean environment: the directories and the one device, nothing of the agent's.
        assert env["CUDA_VISIBLE_DEVICES"] == uuid and set(env) == {
            "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES", "PATH"}
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(host.root / "run/hostagent/mps" / uuid / "pipe")
        log = (mps.log_dir(host, uuid) / "control.log").read_text()
        assert "Cmd:set_default_active_thread_percentage 30" in log
        assert "Cmd:set_default_device_pinned_mem_limit 0 10240M" in log        # 40 GiB / 4 replicas
    if os.geteuid() == 0:                     # the shared /dev/shm clients and servers meet in
        assert os.path.ismount(mps.shm_dir(host))

    code, out, err = run(capsys, host, "status", "-o", "json")
    status = json.loads(out)
    by_name = {d["name"]: d for d in status["devices"]}
    assert by_name["0"]["mps"]["state"] == "ready" and by_name["0"]["replica_ids"][3] == f"{u0}::3"
    assert by_name["2"]["strategy"] == "time-slicing" and by_name["2"]["interval"] == "Short"
    code, out, _ = run(capsys, host, "apply", "-f", cfg)
    assert code == 0 and out.strip() == "already in place, nothing changed"

    code, out, err = run(capsys, host, "off")
    assert code == 0, out + err
    assert "GPU 0: compute mode EXCLUSIVE_PROCESS -> DEFAULT (as before sharing)" in out
    assert running(host.root) == [] and not mps.daemon_dir(host, u0).exists()
    assert modes(host)[:3] == ["DEFAULT"] * 3 and "Timeslice: Default" in smi(host, "compute-policy", "-l", "-i", "2")
    assert not os.path.ismount(mps.shm_dir(host)) and not (host.root / "etc/hostagent/sharing.yaml").exists()
    code, out, _ = run(capsys, host, "status")
    assert out.strip() == "no device is shared"


MPS_0 = "sharing:\n  mps:\n    resources:\n    - {name: gpu, devices: [0], replicas: 2}\n"
MPS_01 = "sharing:\n  mps:\n    resources:\n    - {name: gpu, devices: [0, 1], replicas: 2}\n"
MPS_2 = "sharing:\n  mps:\n    resources:\n    - {name: gpu, devices: [2], replicas: 2}\n"


@ROOT
def test_a_failed_apply_is_rolled_back_and_records_nothing(node, capsys, tmp_path):
    host, _ = node
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(MPS_0)
    second.write_text(MPS_01)
    assert run(capsys, host, "apply", "-f", first)[0] == 0
    recorded = (host.root / "etc/hostagent/sharing.yaml").read_text()
    inv = read_inventory(host)
    u0, u1 = inv.gpus[0].uuid, inv.gpus[1].uuid
    pid0 = daemon_pid(host, u0)
    mps.daemon_dir(host, u1).write_text("in the way")          # GPU 1's daemon cannot get its folders
    code, out, err = run(capsys, host, "apply", "-f", second)
    mps.daemon_dir(host, u1).unlink()
    assert code == 1 and "FAILED: GPU 1: start its MPS control daemon" in out, out + err
    assert "rolled back to the configuration in force before" in out
    assert "GPU 1: compute mode EXCLUSIVE_PROCESS -> DEFAULT (as before sharing)" in out.split("rolled back")[1]
    assert (host.root / "etc/hostagent/sharing.yaml").read_text() == recorded
    assert modes(host)[:2] == ["EXCLUSIVE_PROCESS", "DEFAULT"] and daemon_pid(host, u0) == pid0
    assert daemon_pid(host, u1) is None and not SharingJournal.path(host).exists()
    assert [d["name"] for d in json.loads(run(capsys, host, "status", "-o", "json")[1])["devices"]] == ["0"]
    assert run(capsys, host, "off")[0] == 0


@ROOT
def test_an_apply_killed_half_way_is_rolled_back_by_the_next_command(node, capsys, tmp_path):
    """Killed (-9) once it stopped the old daemons: the old configuration is still the one
    recorded, its daemons stopped; the next command brings them back, and says so."""
    host, _ = node
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(MPS_01)
    second.write_text(MPS_2)
    assert run(capsys, host, "apply", "-f", first)[0] == 0
    killed = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), "sharing",
                             "apply", "-f", str(second)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HOSTAGENT_FAULT": "sharing:after_stops"})
    assert killed.returncode == -9, killed.stderr
    inv = read_inventory(host)
    assert [daemon_pid(host, g.uuid) for g in inv.gpus[:3]] == [None, None, None]
    assert SharingJournal.path(host).exists()
    code, _, err = run(capsys, host, "status")
    assert "was interrupted; the next 'hostagent sharing apply' or 'off'" in err
    code, out, err = run(capsys, host, "apply", "-f", first)
    assert code == 0 and err.startswith("hostagent: note: rolled back the sharing apply started "), err
    assert out.strip() == "already in place, nothing changed"
    assert all(mps.probe(host, g.uuid) for g in inv.gpus[:2]) and daemon_pid(host, inv.gpus[2].uuid) is None
    assert not SharingJournal.path(host).exists()
    assert run(capsys, host, "off")[0] == 0


@ROOT
def test_off_with_force_stops_sharing_that_allocations_use(node, capsys):
    """What removing the package runs (the daemon stopped): devices in allocations keep their
    sharing unless forced; forced, every daemon stops, the modes come back and the shared
    /dev/shm is unmounted."""
    from hostagent.daemon import checkpoint
    from hostagent.daemon.allocations import Allocation
    host, cfg = node
    assert run(capsys, host, "apply", "-f", cfg)[0] == 0
    u0 = read_inventory(host).gpus[0].uuid
    checkpoint.save(host, [Allocation("pod-a", (u0,), {"id": "pod-a", "devices": [{"device": "0"}],
                                                       "sharing": {"strategy": "MPS"}}, 0.0,
                                      replicas=(f"{u0}::0",), shared_as="mps")])
    code, out, err = run(capsys, host, "off")
    assert code == 1 and "pod-a" in err and daemon_pid(host, u0) is not None
    code, out, err = run(capsys, host, "off", "--force")
    assert code == 0, out + err
    assert running(host.root) == [] and modes(host)[:3] == ["DEFAULT"] * 3
    assert not os.path.ismount(mps.shm_dir(host)) and not mps.daemon_dir(host, u0).exists()


@ROOT
def test_the_compute_mode_keeps_other_processes_off_an_mps_gpu(node, capsys):
    """EXCLUSIVE_PROCESS lets the MPS server be the GPU's one context: a client's server
    starts through the daemon, a process bypassing MPS is refused, and an MPS server is
    refused in turn on a GPU another process holds."""
    host, cfg = node
    assert run(capsys, host, "apply", "-f", cfg)[0] == 0
    inv = read_inventory(host)
    env = mps.environment(host, inv.gpus[0].uuid)
    tool = str(host.driver("usr/bin/nvidia-cuda-mps-control"))
    answer = subprocess.run([tool], input="start_server -uid 1000\nget_server_list\n", env=env,
                            capture_output=True, text=True)
    assert answer.returncode == 0 and answer.stdout.strip().isdigit()
    held = subprocess.run([os.path.join(sysconfig.get_path("scripts"), "hostagent"),
                           "--simulate", str(host.root), "sim", "hold", "0"], capture_output=True, text=True)
    assert held.returncode == 1 and "all CUDA-capable devices are busy or unavailable" in held.stderr
    assert subprocess.run([str(host.driver("usr/bin/nvidia-smi")), "-i", "1", "-c", "PROHIBITED"]).returncode == 0
    env1 = mps.environment(host, inv.gpus[1].uuid)
    refused = subprocess.run([tool], input="start_server -uid 1000\n", env=env1, capture_output=True, text=True)
    assert "Failed to start server: Failed to create a server context on device 1: all CUDA-capable devices " \
           "are busy or unavailable" in refused.stdout
    assert "failed to start" in (mps.log_dir(host, inv.gpus[1].uuid) / "control.log").read_text()
    # The agent set EXCLUSIVE_PROCESS, someone else PROHIBITED: status shows it, apply puts it right.
    code, out, _ = run(capsys, host, "apply", "-f", cfg, "--dry-run")
    assert "GPU 1: compute mode PROHIBITED -> EXCLUSIVE_PROCESS" in out
    assert run(capsys, host, "off")[0] == 0
    assert modes(host)[1] == "DEFAULT"


@pytest.mark.parametrize("body, says", [
    ("sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 64}\n",
     "64 replicas is more than the 48 MPS clients GPU 0"),
    ("sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/tpu, replicas: 2}\n", "no resource 'nvidia.com/tpu'"),
    ("sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2, devices: [1]}\n"
     "  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, devices: [1]}\n",
     "is shared with both MPS and time-slicing"),
    ("sharing: {mps: {resources: [{name: gpu, replicas: 2}]}\n", "not valid YAML or JSON"),
])
def test_bad_input_is_one_line_and_changes_nothing(node, capsys, tmp_path, body, says):
    host, _ = node
    bad = tmp_path / "bad.yaml"
    bad.write_text(body)
    code, out, err = run(capsys, host, "apply", "-f", bad)
    assert code == 1 and out == "" and err.count("\n") == 1 and says in err, err
    assert err.startswith(f"hostagent: error: {bad}") or err.startswith("hostagent: error: ")
    assert running(host.root) == [] and not (host.root / "etc/hostagent/sharing.yaml").exists()
    assert not (host.root / "run/hostagent/mps").exists() and set(modes(host)) == {"DEFAULT"}


def test_an_alias_bomb_is_one_short_line_at_once(node, capsys, tmp_path):
    host, _ = node
    bomb = tmp_path / "bomb.yaml"
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    code, out, err = run(capsys, host, "apply", "-f", bomb)
    assert time.monotonic() - started < 10
    assert code == 1 and out == "" and err == (f"hostagent: error: {bomb}: has more than 100000 values (aliases "
                                              "expanded), more than any sharing configuration needs; not read\n")


def test_numbers_without_a_fraction_and_trailing_commas_as_the_device_plugin_reads_them(node, capsys, tmp_path):
    host, _ = node
    cfg = tmp_path / "floats.json"
    cfg.write_text('{"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2.0, '
                   '"devices": 2.0,}]}}, "newerPluginKey": true}')
    code, out, err = run(capsys, host, "apply", "-f", cfg, "--dry-run")
    assert code == 0 and out.splitlines() == ["GPU 0: time-slicing, 2 replicas of nvidia.com/gpu",
                                                  "GPU 1: time-slicing, 2 replicas of nvidia.com/gpu"], err
    assert f"hostagent: warning: {cfg}: (top level): unknown key 'newerPluginKey', ignored" in err
    cfg.write_text("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2.5}]}}")
    code, out, err = run(capsys, host, "apply", "-f", cfg, "--dry-run")
    assert code == 1 and err.count("\n") == 1 and "replicas: must be of type integer, not a number" in err


def test_mps_on_a_gpu_without_mps_support_is_refused(make_node, capsys, tmp_path):
    """A Kepler-era board (compute capability 3.0, before MPS's 3.5): its facts edited as
    the 535-driver test edits the driver version, so NVML reports it."""
    host, store = make_node("t4x2")
    facts = json.loads((host.root / ".sim/node.json").read_text())
    facts["skus"]["T4"]["compute_capability"] = "3.0"
    (host.root / ".sim/node.json").write_text(json.dumps(facts))
    cfg = tmp_path / "mps.yaml"
    cfg.write_text("sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n")
    code, out, err = run(capsys, host, "apply", "-f", cfg)
    assert code == 1 and "does not support MPS (compute capability 3.5 or newer is needed)" in err, err
    assert running(host.root) == [] and not (host.root / "etc/hostagent/sharing.yaml").exists()
    cfg.write_text("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}\n")
    assert run(capsys, host, "apply", "-f", cfg, "--dry-run")[0] == 0       # time-slicing needs no MPS


@ROOT
def test_labels_without_the_daemon_follow_the_sharing_in_force(node, capsys):
    host, cfg = node
    assert run(capsys, host, "apply", "-f", cfg)[0] == 0
    try:
        assert main(["--simulate", str(host.root), "labels", "-o", "json"]) == 0
        labels = json.loads(capsys.readouterr().out)
        assert labels["nvidia.com/gpu.sharing-strategy"] == "mps" and labels["nvidia.com/gpu.replicas"] == "4"
        assert labels["nvidia.com/mps.capable"] == "true"
        assert main(["--simulate", str(host.root), "labels", "--sharing-strategy", "none", "-o", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["nvidia.com/gpu.sharing-strategy"] == "none"
    finally:
        assert run(capsys, host, "off")[0] == 0
