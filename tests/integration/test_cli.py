"""The hostagent command line as users run it: real processes, real exit codes."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.rootneeds import GPU_CHANGES
from tests.waiting import until


def hostagent(*args, env=None, check=True):
    run_env = {k: v for k, v in os.environ.items() if k != "HOSTAGENT_SIMULATE"}
    run_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "hostagent.cli.main", *map(str, args)],
                          capture_output=True, text=True, env=run_env)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def node(make_node):
    host, store = make_node("mixed")
    return host.root


def test_version():
    from hostagent import __version__
    assert hostagent("--version").stdout.strip() == f"hostagent {__version__}"


def test_devices_json_and_yaml_agree(node):
    data = json.loads(hostagent("--simulate", node, "devices", "-o", "json").stdout)
    assert [g["product"] for g in data["gpus"]] == ["NVIDIA A100-SXM4-80GB"] * 2 + ["Tesla T4"]
    assert [g["name"] for g in data["gpus"]] == ["0", "1", "2"]
    assert data["gpus"][2]["mig"] is None and data["gpus"][2]["mig_capable"] is False
    assert data["gpus"][0]["mig_capable"] is True
    assert data["gpus"][0]["mig"]["mode"] == {"current": "disabled", "pending": "disabled"}
    # PCI ids as nvidia-smi and mig-parted's device filters write them.
    assert [(g["pci_device_id"], g["pci_subsystem_id"]) for g in data["gpus"]][1:] == [
        ("0x20B210DE", "0x147F10DE"), ("0x1EB810DE", "0x12A210DE")]
    assert "profiles" not in data["gpus"][0]["mig"]           # only with --profiles
    assert [g["numa_node"] for g in data["gpus"]] == [0, 0, 1]
    assert data["mig_devices"] == [] and data["unreadable"] == [] and data["unread"] == []
    # Without a daemon: health unknown, and what only the daemon knows is left out.
    assert {g["health"]["state"] for g in data["gpus"]} == {"unknown"}
    assert not {"allocations", "allocatable", "replicas", "revision", "cdi_devices"} & set(data["gpus"][0])
    assert "revision" not in data
    keys = list(data["gpus"][0])
    assert keys.index("mig_capable") == keys.index("mig") - 1
    assert yaml.safe_load(hostagent("--simulate", node, "devices", "-o", "yaml").stdout) == data
    with_profiles = json.loads(hostagent("--simulate", node, "devices", "--profiles", "-o", "json").stdout)
    names = [p["name"] for p in with_profiles["gpus"][0]["mig"]["profiles"]]
    assert "3g.40gb" in names and "1g.10gb+me" in names
    assert with_profiles["gpus"][1]["mig"]["profiles"] == with_profiles["gpus"][0]["mig"]["profiles"]
    assert with_profiles["gpus"][2]["mig"] is None


def test_devices_table_shows_mig_devices_and_profiles(node):
    env = {"HOSTAGENT_SIMULATE": str(node)}
    hostagent("sim", "reboot", env=env)           # nothing pending: a no-op for modes
    out = hostagent("devices", "--profiles", env=env).stdout
    assert "GPU 2 (Tesla T4): not MIG capable" in out
    assert "3g.40gb" in out and "0,4 (size 4)" in out
    # The two identical A100s share one profile table.
    assert out.count("MIG GPU-instance profiles:") == 1
    assert "GPUs 0-1 (NVIDIA A100-SXM4-80GB) MIG GPU-instance profiles:" in out


def test_node_reports_versions_and_paths(node):
    data = yaml.safe_load(hostagent("--simulate", node, "node", "-o", "yaml").stdout)
    assert data["driver_version"] == "550.90.07" and data["cuda_driver_version"] == "12.4"
    assert data["paths"]["root"] == str(node) and data["simulated"] is True
    assert "driver version" in hostagent("--simulate", node, "node").stdout


def test_sim_profiles_lists_every_profile():
    out = hostagent("sim", "profiles").stdout
    for name in ("dgx-a100", "hgx-h100", "hgx-h200", "a30x4", "t4x2", "mixed"):
        assert name in out


def test_sim_create_refuses_to_overwrite_and_rejects_unknown_profiles(tmp_path):
    hostagent("sim", "create", "--profile", "t4x2", "--root", tmp_path)
    again = hostagent("sim", "create", "--profile", "t4x2", "--root", tmp_path, check=False)
    assert again.returncode == 2 and "--force" in again.stderr
    hostagent("sim", "create", "--profile", "t4x2", "--root", tmp_path, "--force")
    bad = hostagent("sim", "create", "--profile", "dgx-z9", "--root", tmp_path / "new", check=False)
    assert bad.returncode == 2 and "dgx-a100" in bad.stderr
    assert not (tmp_path / "new").exists()


NOT_A_NODE = "{folder}: not a simulated node (no .sim/node.json) (make it one first: hostagent sim create " \
             "--profile dgx-a100 --root {folder})"


@pytest.mark.parametrize("command, says", [
    (["cdi", "refresh"], NOT_A_NODE), (["sharing", "off"], NOT_A_NODE),
    (["mig", "apply", "-c", "all-disabled"], NOT_A_NODE), (["serve"], NOT_A_NODE),
    # Engine files only: it may work on a tree of them, and takes its lock without a file.
    (["runtime", "configure", "--runtime", "containerd"],
     "{folder}/etc/containerd: the directory does not exist (is the engine installed? nothing was changed)")])
def test_nothing_is_written_into_a_folder_that_is_not_a_node(tmp_path, command, says):
    folder = tmp_path / "not-yet"
    folder.mkdir()
    done = hostagent("--simulate", folder, *command, check=False)
    assert done.returncode == 1 and done.stderr == f"hostagent: error: {says.format(folder=folder)}\n"
    if command == ["serve"]:                  # hostagentd, the same daemon
        daemon = subprocess.run([sys.executable, "-m", "hostagent.daemon.main", "--simulate", str(folder)],
                                capture_output=True, text=True, timeout=60)
        assert daemon.returncode == 1 and daemon.stderr.startswith(f"hostagentd: error: {folder}: not a simulated node")
    assert list(folder.iterdir()) == []
    hostagent("sim", "create", "--profile", "t4x2", "--root", folder)        # still a folder it takes


def test_errors_are_one_line_with_exit_codes(node, tmp_path):
    missing = hostagent("--simulate", tmp_path, "devices", check=False)
    assert missing.returncode == 1 and "not a simulated node" in missing.stderr
    bad_gpu = hostagent("sim", "xid", "--gpu", "9", "--xid", "48", "--root", node, check=False)
    assert bad_gpu.returncode == 2 and "no GPU 9" in bad_gpu.stderr        # an unknown name: a usage error
    hold = hostagent("sim", "hold", "9", "--root", node, check=False)
    assert hold.returncode == 2 and "no device '9' on the simulated node" in hold.stderr
    config = hostagent("--simulate", node, "mig", "apply", "-c", "no-such-config", check=False)
    assert config.returncode == 2 and "no MIG config named 'no-such-config'" in config.stderr
    usage = hostagent("devices", "-o", "xml", check=False)
    assert usage.returncode == 2
    no_root = hostagent("sim", "reboot", check=False)
    assert no_root.returncode == 2 and "--root" in no_root.stderr


def test_sim_verbs_drive_the_node(node):
    from hostagent.sim.store import SimStore
    store = SimStore(node)
    out = hostagent("sim", "hold", "0", "--root", node, "--name", "trainer").stdout
    pid = int(out.split()[1])
    assert [p.pid for p in store.read().processes] == [pid]
    hostagent("sim", "release", pid, "--root", node)
    assert store.read().processes == []
    hostagent("sim", "xid", "--gpu", "1", "--xid", "48", "--root", node)
    hostagent("sim", "ecc", "--gpu", "1", "--root", node)
    assert [e.data for e in store.read().events] == [48, 0]
    hostagent("sim", "lose", "--gpu", "0", "--root", node)
    out = hostagent("--simulate", node, "devices").stdout
    assert "GPU 0: unreadable: GPU is lost" in out
    hostagent("sim", "driver", "unload", "--root", node)
    failed = hostagent("--simulate", node, "devices", check=False)
    assert failed.returncode == 1 and "kernel driver is not loaded" in failed.stderr


def health_requests(client) -> float:
    """How many GET /v1/health the daemon has answered, from its own request counter."""
    from prometheus_client.parser import text_string_to_metric_families
    return sum(s.value for f in text_string_to_metric_families(client.metrics()) for s in f.samples
               if s.name == "hostagent_api_requests_total" and s.labels.get("route") == "/v1/health")


def test_devices_show_a_lost_gpu_the_daemon_no_longer_lists():
    """A lost GPU leaves the daemon's device list at its next inventory read; its health
    record stays (GET /v1/health, by UUID, ``lost``) and ``hostagent devices`` shows it."""
    from .agentd import AgentProcess, make_root
    agent = AgentProcess(make_root("t4x2"), {"daemon": {"resync_interval": 0},
                                             "health": {"wait_timeout_ms": 200}})
    env = {"HOSTAGENT_SIMULATE": str(agent.root)}
    try:
        agent.start()
        with agent.client() as c:
            # Every GPU readable: GET /v1/devices carries all health, GET /v1/health is not asked.
            before = health_requests(c)
            hostagent("devices", env=env)
            assert health_requests(c) == before
            uuid = c.device("1")["uuid"]
            hostagent("sim", "lose", "--gpu", "1", "--root", agent.root)
            until(lambda: any(d["key"] == uuid and d["lost"] for d in c.health()["devices"]), 30, lambda: c.health(), interval=0.1)
            c.refresh()
            assert [g["index"] for g in c.devices()["gpus"]] == [0]       # gone from the list
            before = health_requests(c)
        out = hostagent("devices", env=env).stdout
        with agent.client() as c:
            assert health_requests(c) == before + 1                      # for the lost GPU
        rows = [line.split() for line in out.splitlines()[1:3]]
        assert rows[0][:2] == ["0", "0"] and rows[0][-1] == "healthy"
        assert rows[1] == ["1", "-", uuid, "lost", "-", "-", "-", "-", "-", "nvidia", "unhealthy"]
        assert "GPU 1: unreadable: GPU is lost; health: unhealthy" in out
        data = json.loads(hostagent("devices", "-o", "json", env=env).stdout)
        assert [g["index"] for g in data["gpus"]] == [0]
        (lost,) = data["unreadable"]
        assert (lost["index"], lost["uuid"], lost["lost"]) == (1, uuid, True)
        assert (lost["health"]["state"], lost["health"]["reason"]) == ("unhealthy", "gpu_lost")
        assert lost["health"]["message"].endswith("; until cleared")
        assert yaml.safe_load(hostagent("devices", "-o", "yaml", env=env).stdout) == data
        hostagent("health", "clear", "1", env=env)      # healthy, unmonitored: still lost
        data = json.loads(hostagent("devices", "-o", "json", env=env).stdout)
        assert data["unreadable"][0]["lost"] and data["unreadable"][0]["health"]["state"] == "unmonitored"
    finally:
        agent.stop()
        agent.cleanup()


def test_sim_driver_unload_is_refused_while_a_gpu_is_held(node):
    from hostagent.sim.store import SimStore
    hostagent("sim", "hold", "0", "--root", node)
    refused = hostagent("sim", "driver", "unload", "--root", node, check=False)
    assert refused.returncode == 1 and "in use" in refused.stderr
    assert SimStore(node).read().driver_loaded
    hostagent("sim", "release", "--root", node)
    hostagent("sim", "driver", "unload", "--root", node)
    assert not SimStore(node).read().driver_loaded


def test_demo_runs_on_a_temporary_node_and_names_no_folder_it_removed():
    import re
    import tempfile
    before = set(os.listdir(tempfile.gettempdir()))
    out = hostagent("sim", "demo").stdout
    assert out.count("NVIDIA A100-SXM4-40GB") == 8 and "driver 550.90.07" in out
    assert "hostagent-sim-" not in out and not re.search(r"/tmp/\S+", out)
    assert not {d for d in set(os.listdir(tempfile.gettempdir())) - before if d.startswith("hostagent-sim-")}


# ---- building a node where device nodes cannot be made -------------------------------

def _can_run(*cmd):
    try:
        return subprocess.run([*cmd, "true"], capture_output=True).returncode == 0
    except OSError:
        return False


NO_MKNOD = [pytest.param(["unshare", "-r"], id="user-namespace",
                         marks=pytest.mark.skipif(not _can_run("unshare", "-r"),
                                                  reason="unshare -r is not available here")),
            pytest.param(["setpriv", "--bounding-set=-mknod", "--inh-caps=-mknod"], id="no-cap-mknod",
                         marks=pytest.mark.skipif(os.geteuid() != 0 or not _can_run("setpriv", "--bounding-set=-mknod", "--inh-caps=-mknod"),
                                                  reason="dropping CAP_MKNOD needs root and setpriv"))]


@pytest.mark.parametrize("prefix", NO_MKNOD)
def test_without_the_right_to_mknod_nodes_are_regular_files_and_said_so(prefix, tmp_path):
    root = tmp_path / "node"
    proc = subprocess.run([*prefix, sys.executable, "-m", "hostagent.cli.main", "sim", "create",
                           "--profile", "t4x2", "--root", str(root)], capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "device nodes: regular files" in proc.stdout
    assert (root / "dev/nvidia0").is_file() and (root / "dev/nvidia-caps/nvidia-cap1").is_file()
    data = yaml.safe_load(hostagent("--simulate", root, "node", "-o", "yaml").stdout)
    assert data["device_nodes"] == "regular-files"
    assert not list(root.glob(".mknod-probe-*"))
    demo = subprocess.run([*prefix, sys.executable, "-m", "hostagent.cli.main", "sim", "demo",
                           "--profile", "t4x2"], capture_output=True, text=True)
    assert demo.returncode == 0 and "Traceback" not in demo.stderr, demo.stderr
    assert "device nodes: regular files" in demo.stdout and demo.stdout.count("Tesla T4") == 2


# ---- replacing a node ----------------------------------------------------------------

@GPU_CHANGES
def test_sim_create_force_replaces_the_whole_old_node(tmp_path):
    from hostagent.sim.store import SimStore
    hostagent("sim", "create", "--profile", "dgx-a100", "--root", tmp_path)
    smi = str(tmp_path / "usr/bin/nvidia-smi")
    subprocess.run([smi, "-i", "0", "-mig", "1"], check=True, capture_output=True)
    subprocess.run([smi, "-r", "-i", "0"], check=True, capture_output=True)
    subprocess.run([smi, "mig", "-i", "0", "-cgi", "9", "-C"], check=True, capture_output=True)
    assert list((tmp_path / "dev/nvidia-caps").glob("nvidia-cap*")) != []
    holder = int(hostagent("sim", "hold", "1", "--root", tmp_path).stdout.split()[1])
    (tmp_path / "var/lib/hostagent").mkdir(parents=True)
    (tmp_path / "var/lib/hostagent/old-state").write_text("the old node's")

    hostagent("sim", "create", "--profile", "t4x2", "--root", tmp_path, "--force")
    assert sorted(p.name for p in (tmp_path / "dev").glob("nvidia[0-9]*")) == ["nvidia0", "nvidia1"]
    assert len(list((tmp_path / "proc/driver/nvidia/gpus").iterdir())) == 2
    assert sorted(p.name for p in (tmp_path / "dev/nvidia-caps").iterdir()) == ["nvidia-cap1", "nvidia-cap2"]
    assert not (tmp_path / "proc/driver/nvidia/capabilities/gpu0").exists()
    libs = {p.name.split(".so.")[1] for p in (tmp_path / "usr/lib/x86_64-linux-gnu").glob("libcuda.so.*.*")}
    assert libs == {"535.183.01"}
    assert [p.name for p in (tmp_path / "lib/firmware/nvidia").iterdir()] == ["535.183.01"]
    assert not (tmp_path / "var/lib/hostagent").exists()
    assert SimStore(tmp_path).read().processes == []
    with pytest.raises(ProcessLookupError):    # the old node's holder was stopped
        for _ in range(100):
            os.kill(holder, 0)
            __import__("time").sleep(0.05)


def test_sim_create_never_builds_over_or_clears_a_directory_without_a_node(tmp_path):
    (tmp_path / "keep").write_text("mine")
    for extra in ([], ["--force"]):
        proc = hostagent("sim", "create", "--root", tmp_path, *extra, check=False)
        assert proc.returncode == 2 and "holds files but no simulated node" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]


# ---- bad roots ---------------------------------------------------------------------

@pytest.mark.parametrize("root, message", [
    ("/etc/passwd/x", "/etc/passwd is not a directory"),
    ("{file}", "not a directory"),
    ("/proc/x", "kernel file system"),
    ("", "no directory given"),
    ("/", "host's own root"),
])
def test_sim_create_refuses_roots_that_cannot_hold_a_node(root, message, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = hostagent("sim", "create", "--root", root.format(file=afile), check=False)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert afile.read_text() == "" and [p.name for p in tmp_path.iterdir()] == ["afile"]


def test_a_root_too_long_for_a_socket_path_still_makes_a_whole_node(tmp_path):
    root = tmp_path / ("n" * 60) / ("o" * 60)
    assert len(str(root / "run/nvidia-persistenced/socket")) > 108
    hostagent("sim", "create", "--profile", "t4x2", "--root", root)
    import stat
    assert stat.S_ISSOCK(os.lstat(root / "run/nvidia-persistenced/socket").st_mode)
    assert json.loads(hostagent("--simulate", root, "devices", "-o", "json").stdout)["gpus"][1]["index"] == 1


def test_a_corrupt_state_file_is_named_with_what_to_do(node):
    state = node / ".sim/state.json"
    state.write_text('{"gpus": [')
    for args in (["--simulate", node, "devices"], ["sim", "hold", "0", "--root", node]):
        proc = hostagent(*args, check=False)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert str(state) in proc.stderr and "sim create --force" in proc.stderr
        assert "crashed" not in proc.stderr
    smi = subprocess.run([str(node / "usr/bin/nvidia-smi"), "-L"], capture_output=True, text=True)
    assert smi.returncode != 0 and "Traceback" not in smi.stderr and str(state) in smi.stderr


def test_an_unexpected_file_error_is_one_line_naming_the_path_and_v_gives_detail(node):
    lock = node / ".sim/lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()                        # unusable as a lock file: not an error hostagent expects
    proc = hostagent("sim", "hold", "0", "--root", node, check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"hostagent: error: {lock}: Is a directory (run with -v for details)"]
    verbose = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "sim", "hold", "0",
                              "--root", str(node), "-v"], capture_output=True, text=True)
    # -v adds what the system said, not a traceback.
    assert verbose.returncode == 1 and "Traceback" not in verbose.stderr
    assert verbose.stderr.splitlines()[0] == f"hostagent: error: {lock}: Is a directory"
    assert f"hostagent: detail: IsADirectoryError: [Errno 21] Is a directory: '{lock}' [EISDIR]" in verbose.stderr


def test_an_empty_simulate_or_root_is_refused_not_taken_for_the_host_or_cwd(node):
    proc = hostagent("--simulate", "", "devices", check=False)
    assert proc.returncode == 2 and "--simulate needs a directory" in proc.stderr
    proc = hostagent("sim", "reboot", "--root", "", env={"HOSTAGENT_SIMULATE": str(node)}, check=False)
    assert proc.returncode == 2 and "--root needs a directory" in proc.stderr
