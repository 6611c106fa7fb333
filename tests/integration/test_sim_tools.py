"""The driver's helper binaries of a simulated node, run as real subprocesses.

Each test builds a node with ``create_node`` and runs ``<root>/usr/bin/<tool>``; state is
checked through ``SimStore``. Every background process a test starts (MPS daemon and
servers, persistenced, holders) is stopped by a fixture finaliser.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from hostagent.devices import read_inventory
from hostagent.sim import control
from hostagent.sim.driverroot import create_node
from hostagent.sim.files import mig_minors
from hostagent.sim.node import MIG_DISABLE, MIG_ENABLE
from hostagent.sim.platform import simulated_host
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

TIMEOUT = 10


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k != "HOSTAGENT_SIMULATE" and not k.startswith("CUDA_")}
    env.update(extra)
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        until(lambda: not _alive(pid), 3)
    except AssertionError:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class Node:
    def __init__(self, root: Path, profile: str):
        self.root = root
        self.store = create_node(root, profile)
        self.pid_files: list[Path] = []

    def run(self, tool: str, *args: str, stdin: str | None = None, env: dict | None = None):
        return subprocess.run([str(self.root / "usr/bin" / tool), *args], input=stdin,
                              capture_output=True, text=True, env=env or _env(),
                              timeout=TIMEOUT)

    def smi(self, *args: str):
        return self.run("nvidia-smi", *args)

    def gpu(self, index: int):
        return self.store.read().gpus[index]

    def start_persistenced(self) -> int:
        pid_file = self.root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
        self.pid_files.append(pid_file)
        r = self.run("nvidia-persistenced")
        assert r.returncode == 0, r.stderr
        return _read_pid(pid_file)

    def enable_mig(self, index: int = 0) -> None:
        with self.store.mutate() as state:
            state.set_mig_mode(self.store.facts, index, MIG_ENABLE)
            state.reset_gpu(index)

    def cleanup(self) -> None:
        for path in self.pid_files:
            pid = _read_pid(path)
            if pid:
                _stop(pid)
        try:
            state = self.store.read()
            servers = [p.pid for p in state.processes if p.name == "nvidia-cuda-mps-server"]
        except Exception:
            servers = []
        for pid in servers:
            _stop(pid)
        try:
            control.release(self.store)
        except Exception:
            pass


@pytest.fixture
def sim_node(tmp_path):
    nodes: list[Node] = []

    def make(profile: str = "dgx-a100") -> Node:
        node = Node(tmp_path / f"node{len(nodes)}", profile)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.cleanup()


# ---- nvidia-smi -L -------------------------------------------------------------------

def test_list_gpus_without_mig(sim_node):
    node = sim_node("t4x2")
    r = node.smi("-L")
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    state = node.store.read()
    assert lines == [f"GPU {g.index}: Tesla T4 (UUID: {g.uuid})" for g in state.gpus]
    assert len(lines) == 2 and "MIG" not in r.stdout


def test_list_gpus_with_mig_devices(sim_node):
    node = sim_node()
    node.enable_mig(0)
    with node.store.mutate() as state:
        facts = node.store.facts
        for profile in (9, 19, 14, 19):          # 3g.20gb, 1g.5gb, 2g.10gb, 1g.5gb
            gi = state.create_gi(facts, 0, profile)
            full = facts.skus[state.gpus[0].sku].mig.by_id(profile)
            state.create_ci(facts, 0, gi.id, next(c.id for c in full.ci_profiles
                                                  if c.slices == full.slices))
    r = node.smi("--list-gpus")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    state = node.store.read()
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {state.gpus[0].uuid})"
    # The MIG user guide's GIs 2 (3g at 4:4), 4 (2g at 2:2), 7 and 8 (1g at 0:1, 1:1),
    # listed densely in GI id order, not by placement.
    assert [(gi.id, gi.start) for gi in state.gpus[0].gis] == [(2, 4), (4, 2), (7, 0), (8, 1)]
    names = [line.split()[1] for line in lines[1:5]]
    assert names == ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]
    # The "Device N" numbers are NVML's MIG device indices: the inventory's, CDI's <gpu>:<N>.
    inv = read_inventory(simulated_host(node.root))
    assert [line.split("Device", 1)[1] for line in lines[1:5]] == \
        [f"{d.index:>3}: (UUID: {d.uuid})" for d in inv.gpus[0].mig.devices]
    assert lines[5].startswith("GPU 1: ") and len(lines) == 4 + 8


# ---- MIG mode and reset ----------------------------------------------------------------

@GPU_CHANGES
def test_mig_mode_on_an_idle_ampere_gpu_is_immediate(sim_node):
    node = sim_node()
    r = node.smi("-i", "0", "-mig", "1")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["Enabled MIG Mode for GPU 00000000:07:00.0", "All done."]
    assert (node.gpu(0).mig_current, node.gpu(0).mig_pending) == (MIG_ENABLE, MIG_ENABLE)


@GPU_CHANGES
def test_mig_mode_on_ampere_waits_for_reset_while_a_driver_client_runs(sim_node):
    node = sim_node()
    node.start_persistenced()
    r = node.smi("-i", "0", "-mig", "1")
    assert r.returncode == 0
    # Driver clients keep an Ampere GPU from resetting itself: pending, "In use".
    assert "Warning: MIG mode is in pending enable state for GPU 00000000:07:00.0:In use by another client" in r.stdout
    assert "reboot the system to make MIG mode effective" in r.stdout
    gpu = node.gpu(0)
    assert (gpu.mig_current, gpu.mig_pending) == (MIG_DISABLE, MIG_ENABLE)

    r = node.smi("-r", "-i", "0000:07:00.0")
    assert r.returncode == 0, r.stdout
    assert r.stdout.splitlines() == ["GPU 00000000:07:00.0 was successfully reset.", "All done."]
    assert node.gpu(0).mig_current == MIG_ENABLE

    r = node.smi("--multi-instance-gpu=0", "--id=00000000:07:00.0")
    assert r.returncode == 0 and "pending disable state" in r.stdout
    assert node.gpu(0).mig_pending == MIG_DISABLE


@GPU_CHANGES
def test_mig_mode_on_hopper_is_immediate(sim_node):
    node = sim_node("hgx-h100")
    r = node.smi("-mig", "1", "-i", "1")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["Enabled MIG Mode for GPU 00000000:2A:00.0", "All done."]
    assert node.gpu(1).mig_current == MIG_ENABLE

    control.hold(node.store, "0")
    r = node.smi("-i", "0", "-mig", "1")
    assert r.returncode == 0
    assert ("Warning: MIG mode is in pending enable state for GPU 00000000:18:00.0:"
            "In use by another client") in r.stdout
    assert node.gpu(0).mig_current == MIG_DISABLE


@GPU_CHANGES
def test_mig_mode_not_supported(sim_node):
    node = sim_node("t4x2")
    r = node.smi("-i", "0", "-mig", "1")
    assert r.returncode == 3
    assert "Unable to enable MIG Mode for GPU 00000000:3B:00.0: Not Supported" in r.stdout


@GPU_CHANGES
def test_reset_refused_while_gpu_in_use(sim_node):
    node = sim_node()
    assert node.smi("-i", "0,1", "-mig", "1").returncode == 0
    before = node.store.read().gpus[:2]
    holder = control.hold(node.store, "0")

    r = node.smi("-r", "-i", "0,00000000:0F:00.0")
    assert r.returncode == 255
    assert r.stdout.startswith("The following GPUs could not be reset:\n"
                               "  GPU 00000000:07:00.0: In use by another client\n\n"
                               "1 device is currently being used by one or more other processes")
    assert node.store.read().gpus[:2] == before          # all or nothing

    control.release(node.store, holder.pid)
    r = node.smi("--gpu-reset", "-i", "0,1")
    assert r.returncode == 0
    assert [g.mig_current for g in node.store.read().gpus[:2]] == [MIG_ENABLE, MIG_ENABLE]


# ---- nvidia-smi mig --------------------------------------------------------------------

def test_mig_instances_create_list_destroy(sim_node):
    node = sim_node()
    assert node.smi("mig", "-lgip").stdout.strip() == "No MIG-enabled devices found."
    node.enable_mig(0)

    r = node.smi("mig", "-i", "0", "-cgi", "9,19,14,19", "-C")
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith("Successfully created GPU instance ID ")
    assert lines[0].endswith("on GPU  0 using profile MIG 3g.20gb (ID  9)")
    assert lines[1].endswith("using profile MIG 3g.20gb (ID  2)")
    assert lines[3].endswith("using profile MIG 1g.5gb (ID  0)")
    state = node.store.read()
    assert sorted(gi.profile_id for gi in state.gpus[0].gis) == [9, 14, 19, 19]
    assert all(len(gi.cis) == 1 for gi in state.gpus[0].gis)
    minors = mig_minors()          # nvidia-smi made the capability nodes of the new instances
    minor = state.gpus[0].minor    # the capabilities are named by device minor, not index
    assert minor != 0
    for gi in state.gpus[0].gis:
        for cap in (f"gpu{minor}/gi{gi.id}/access", f"gpu{minor}/gi{gi.id}/ci0/access"):
            assert (node.root / f"dev/nvidia-caps/nvidia-cap{minors[cap]}").exists(), cap

    r = node.smi("mig", "-cgi", "0", "-i", "0")          # no room for a 7g.40gb now
    assert r.returncode == 255
    assert "Insufficient Resources" in r.stdout and "Failed to create GPU instances" in r.stdout

    lgi = node.smi("mig", "-lgi")
    assert lgi.returncode == 0 and lgi.stdout.count("MIG 1g.5gb") == 2
    lci = node.smi("mig", "-lci")
    assert lci.returncode == 0 and "MIG 3g.20gb" in lci.stdout
    lgip = node.smi("mig", "-lgip")
    assert "|   0  MIG 1g.5gb        19     " in lgip.stdout and "GPU  1" not in lgip.stdout

    # A process on one MIG device blocks its CI and GI, nothing else.
    held_gi, held_ci = node.store.read().mig_devices(0)[0]
    control.hold(node.store, held_ci.uuid)
    r = node.smi("mig", "-dci", "-i", "0")
    assert r.returncode == 255
    assert (f"Unable to destroy compute instance ID  0 from GPU  0 GPU instance ID "
            f"{held_gi.id:>2}: In use by another client") in r.stdout
    assert r.stdout.count("Successfully destroyed compute instance") == 3
    r = node.smi("mig", "-dgi")
    assert r.returncode == 255
    assert (f"Unable to destroy GPU instance ID {held_gi.id:>2} from GPU  0: "
            "In use by another client") in r.stdout
    assert r.stdout.count("Successfully destroyed GPU instance") == 3
    assert [gi.id for gi in node.store.read().gpus[0].gis] == [held_gi.id]

    control.release(node.store)
    assert node.smi("mig", "-dci", "-gi", str(held_gi.id), "-ci", "0").returncode == 0
    assert node.smi("mig", "-dgi", "-gi", str(held_gi.id)).returncode == 0
    r = node.smi("mig", "-lgi")
    assert r.returncode == 6 and "No GPU instances found" in r.stdout

    r = node.smi("mig", "-cgi", "3g.20gb", "-i", "0")    # by name, no CI
    assert r.returncode == 0 and "MIG 3g.20gb (ID  9)" in r.stdout
    r = node.smi("mig", "-cci", "-gi", r.stdout.split("GPU instance ID")[1].split()[0])
    assert r.returncode == 0 and "Successfully created compute instance ID  0" in r.stdout


# ---- queries ---------------------------------------------------------------------------

def test_query_gpu_csv(sim_node):
    node = sim_node()
    node.enable_mig(1)
    control.hold(node.store, "0", used_mib=1000)
    r = node.smi("--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,"
                 "mig.mode.current,mig.mode.pending,driver_version,serial", "--format=csv", "-i", "0,1")
    assert r.returncode == 0, r.stdout
    header, *rows = r.stdout.splitlines()
    assert header == ("index, uuid, name, pci.bus_id, memory.total [MiB], memory.used [MiB], "
                      "memory.free [MiB], mig.mode.current, mig.mode.pending, driver_version, serial")
    state = node.store.read()
    assert rows == [
        f"0, {state.gpus[0].uuid}, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 40960 MiB, 1000 MiB, "
        f"39960 MiB, Disabled, Disabled, 550.90.07, {state.gpus[0].serial}",
        f"1, {state.gpus[1].uuid}, NVIDIA A100-SXM4-40GB, 00000000:0F:00.0, 40960 MiB, 0 MiB, "
        f"40960 MiB, Enabled, Enabled, 550.90.07, {state.gpus[1].serial}"]

    r = node.smi("--query-gpu=memory.used,mig.mode.current", "--format=csv,noheader,nounits")
    assert r.stdout.splitlines()[:2] == ["1000, Disabled", "0, Enabled"]

    t4 = sim_node("t4x2")
    assert t4.smi("--query-gpu=mig.mode.current", "--format=csv,noheader").stdout.splitlines() \
        == ["[N/A]", "[N/A]"]

    r = node.smi("--query-gpu=index,minor_number", "--format=csv")
    assert r.returncode == 2
    assert r.stdout.startswith('Field "minor_number" is not a valid field to query.')

    r = node.smi("--query-compute-apps=pid,process_name,used_memory,gpu_bus_id", "--format=csv,noheader")
    pid = node.store.read().processes[0].pid
    assert r.returncode == 0 and r.stdout.splitlines() == [f"{pid}, cuda-app, 1000 MiB, 00000000:07:00.0"]


def test_summary_lists_processes(sim_node):
    node = sim_node("t4x2")
    holder = control.hold(node.store, "1", name="python3", used_mib=2048)
    r = node.smi()
    assert r.returncode == 0
    assert "Driver Version: 535.183.01" in r.stdout and "CUDA Version: 12.2" in r.stdout
    assert "00000000:D8:00.0" in r.stdout and "2048MiB /  15360MiB" in r.stdout
    proc_line = next(line for line in r.stdout.splitlines() if f" {holder.pid} " in line)
    assert "python3" in proc_line and "2048MiB" in proc_line
    control.release(node.store)
    assert "No running processes found" in node.smi().stdout


def test_lost_gpu_and_unloaded_driver(sim_node):
    node = sim_node()
    control.lose_gpu(node.store, 0)
    for args in ((), ("-L",), ("--query-gpu=index", "--format=csv")):
        r = node.smi(*args)
        assert r.returncode == 15
        assert r.stdout.strip() == "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error"
    r = node.smi("-i", "1", "--query-gpu=index", "--format=csv,noheader")
    assert r.returncode == 0 and r.stdout == "1\n"

    control.set_driver_loaded(node.store, False)
    for args in ((), ("-L",), ("mig", "-lgi")):
        r = node.smi(*args)
        assert r.returncode == 9
        assert r.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with "
                                   "the NVIDIA driver. Make sure that the latest NVIDIA driver is "
                                   "installed and running.")


def test_bad_arguments(sim_node):
    node = sim_node("t4x2")
    for args in (("--bogus",), ("-i",), ("-L", "-r"), ("--query-gpu=index",), ("-i", "7", "-L")):
        r = node.smi(*args)
        assert r.returncode in (2, 6), (args, r.stdout)


# ---- MPS -------------------------------------------------------------------------------

def _mps(node: Node, *commands: str, env=None):
    return node.run("nvidia-cuda-mps-control", stdin="".join(c + "\n" for c in commands), env=env)


@GPU_CHANGES
def test_mps_control_daemon_lifecycle(sim_node):
    node = sim_node()
    pipe = node.root / "tmp/nvidia-mps"        # the defaults, inside the root
    logs = node.root / "var/log/nvidia-mps"
    node.pid_files.append(pipe / "nvidia-cuda-mps-control.pid")
    env = _env(CUDA_VISIBLE_DEVICES="1,2")

    r = _mps(node)
    assert r.returncode == 1 and "Cannot find MPS control daemon process" in r.stderr

    r = node.run("nvidia-cuda-mps-control", "-d", env=env)
    assert r.returncode == 0, r.stderr
    assert (pipe / "control").is_socket()
    daemon = _read_pid(pipe / "nvidia-cuda-mps-control.pid")
    assert daemon and _alive(daemon)

    r = node.run("nvidia-cuda-mps-control", "-d", env=env)
    assert r.returncode == 1 and "already running" in r.stderr
    assert _read_pid(pipe / "nvidia-cuda-mps-control.pid") == daemon

    r = _mps(node, "get_server_list")
    assert r.returncode == 0 and r.stdout == ""

    r = _mps(node, "start_server -uid 0", "get_server_list",
             "set_default_active_thread_percentage 50", "get_default_active_thread_percentage",
             "set_default_device_pinned_mem_limit 0 2048M", "get_default_device_pinned_mem_limit 0",
             "no_such_command")
    assert r.returncode == 0, r.stderr
    server_line, atp, pinned, unknown = r.stdout.splitlines()
    server = int(server_line)
    assert _alive(server)
    assert (atp, pinned, unknown) == ("50.0", "2048M", "Unrecognized command")

    # The server holds the devices the daemon was limited to.
    until(lambda: sorted(p.gpu for p in node.store.read().processes if p.pid == server) == [1, 2], 5,
          "server holding GPUs 1 and 2")
    assert node.smi("-r", "-i", "1").returncode == 255

    r = _mps(node, "quit")
    assert r.returncode == 0
    assert not (pipe / "control").exists()
    assert not (pipe / "nvidia-cuda-mps-control.pid").exists()
    until(lambda: not _alive(daemon) and not _alive(server), 5, "end of the daemon and its server")
    log = (logs / "control.log").read_text()
    assert "Starting control daemon using socket" in log and "CUDA_VISIBLE_DEVICES=1,2" in log
    assert log.rstrip().endswith("] Exit")
    assert "] Startup" in (logs / "server.log").read_text()
    until(lambda: not node.store.read().processes, 5, "end of the server's process records")


def test_mps_daemon_stops_on_sigterm(sim_node, tmp_path):
    node = sim_node("t4x2")
    pipe, logs = tmp_path / "mps/pipe", tmp_path / "mps/log"
    env = _env(CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs))
    node.pid_files.append(pipe / "nvidia-cuda-mps-control.pid")
    assert node.run("nvidia-cuda-mps-control", "-d", env=env).returncode == 0
    daemon = _read_pid(pipe / "nvidia-cuda-mps-control.pid")
    r = _mps(node, "start_server -uid 0", "get_server_list", env=env)
    server = int(r.stdout.strip())
    os.kill(daemon, signal.SIGTERM)
    until(lambda: not _alive(daemon) and not _alive(server), 5, "end of the daemon and its server")
    assert not (pipe / "control").exists()
    assert (logs / "control.log").read_text().rstrip().endswith("] Exit")
    assert not (node.root / "tmp/nvidia-mps/control").exists()     # the env var won


# ---- persistenced ----------------------------------------------------------------------

def test_persistenced_version(sim_node):
    node = sim_node("t4x2")
    r = node.run("nvidia-persistenced", "--version")
    assert r.returncode == 0
    assert "nvidia-persistenced:  version 535.183.01" in r.stdout


def test_persistenced_daemon(sim_node):
    node = sim_node()
    pid_file = node.root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    sock = node.root / "run/nvidia-persistenced/socket"
    node.pid_files.append(pid_file)

    r = node.run("nvidia-persistenced", "--user", "root", "--verbose")
    assert r.returncode == 0, r.stderr
    pid = _read_pid(pid_file)
    assert pid and _alive(pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock))                                  # listening now
    assert " On  |" in node.smi().stdout                      # Persistence-M

    r = node.run("nvidia-persistenced")
    assert r.returncode == 1 and "failed to initialize" in r.stderr
    assert _read_pid(pid_file) == pid

    os.kill(pid, signal.SIGTERM)
    until(lambda: not _alive(pid), 5, "end of nvidia-persistenced")
    assert not pid_file.exists() and not sock.exists()
    log = (node.root / "var/log/nvidia-persistenced.log").read_text()
    assert f"Started ({pid})" in log and f"Shutdown ({pid})" in log


def test_versions_follow_a_simulated_upgrade(sim_node):
    """nvidia-smi reads what the driver root holds now, as the fake NVML does: an upgrade
    without a reload is a version mismatch, and after the reload the new version shows."""
    from hostagent.sim import faults
    node = sim_node("t4x2")
    assert "Driver Version: 535.183.01" in node.smi().stdout
    faults.inject(node.store, "mismatch", version="550.127.05")     # packages upgraded, old module loaded
    r = node.smi()
    assert r.returncode == 18
    assert r.stdout == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.127\n"
    faults.clear(node.store, "mismatch")                              # the new module comes up
    r = node.smi()
    assert r.returncode == 0
    assert "NVIDIA-SMI 550.127.05" in r.stdout and "Driver Version: 550.127.05" in r.stdout
    assert "CUDA Version: 12.4" in r.stdout                            # R550's, not R535's 12.2
    r = node.smi("--query-gpu=driver_version", "--format=csv,noheader")
    assert r.stdout == "550.127.05\n550.127.05\n"
    inv = read_inventory(simulated_host(node.root))
    assert inv.driver_version == "550.127.05" and inv.cuda_driver_version == "12.4"
