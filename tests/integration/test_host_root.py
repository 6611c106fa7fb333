"""A host's / mounted elsewhere (--host-root), as the DaemonSet's container sees it at /host:
files land under the root, and what the host's programs read names host paths."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml

import hostagent
from hostagent.cdi.validate import validate_spec
from hostagent.devices.nvmllib import load_host_library
from hostagent.hostroot import HostRoot, resolve_within
from hostagent.sim.driverroot import LIB_DIR
from hostagent.sim.platform import simulator
from tests.waiting import until

from ..programs import script



def debian_like(root: Path) -> Path:
    """What a Debian host has and the simulator does not make: /var/run -> /run, and a
    python3 (here one that runs this machine's) for the hook."""
    (root / "var").mkdir(exist_ok=True)
    (root / "var/run").symlink_to("/run")
    (root / "usr/bin/python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (root / "usr/bin/python3").chmod(0o755)
    return root


def run(*args, check=True):
    done = subprocess.run([script("hostagent"), *args], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("HOSTAGENT_")})
    assert not check or done.returncode == 0, done.stderr
    return done


def host_paths(spec: dict) -> set[str]:
    """Every path of the host the spec names: its mounts' and device nodes' (a node without
    hostPath is at its path on the host)."""
    out = set()
    for edits in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]:
        out |= {m["hostPath"] for m in edits.get("mounts", ())}
        out |= {n.get("hostPath", n["path"]) for n in edits.get("deviceNodes", ())}
    return out


def test_a_mounted_node_gets_a_spec_of_host_paths_under_its_own_cdi_folder(make_node):
    host, _ = make_node("t4x2")
    root = debian_like(host.root)
    as_simulated = json.loads(run("--simulate", str(root), "cdi", "generate").stdout)
    out = run("--simulate", str(root), "--host-root", str(root), "cdi", "refresh")
    # /var/run/cdi is the root's /run/cdi (its /var/run -> /run), never this machine's.
    assert f"{root}/run/cdi/nvidia.com-gpu.json: created" in out.stdout
    spec = json.loads((root / "run/cdi/nvidia.com-gpu.json").read_text())
    assert validate_spec(spec) == []
    paths = host_paths(spec)
    assert paths and not [p for p in paths if p.startswith(str(root))]
    # Every host path is a file of the host (its links followed as the host would).
    assert all(resolve_within(root, p).exists() for p in paths)
    # The same spec as the simulated node's, the root taken off its paths; the hook is
    # the host's python3 with the copy of the hook program kept on the host.
    assert {str(root) + p for p in paths} == host_paths(as_simulated)
    [hook] = spec["containerEdits"]["hooks"]
    assert hook["path"] == "/usr/bin/python3" and "sys.path.append('/var/lib/hostagent/hook')" in hook["args"][4]
    copy = root / "var/lib/hostagent/hook/hostagent/hooks/main.py"
    assert copy.read_bytes() == (Path(hostagent.__file__).parent / "hooks/main.py").read_bytes()
    program = subprocess.run([sys.executable, "-I", "-S", "-c", hook["args"][4].replace(
        "/var/lib/hostagent/hook", str(root / "var/lib/hostagent/hook")), "--version"],
        capture_output=True, text=True)
    assert program.returncode == 0 and hostagent.__version__ in program.stdout + program.stderr
    # Another version's copy (an older image) is replaced even when the spec is unchanged.
    copy.write_text("raise SystemExit('old')\n")
    (copy.parent / "gone.py").write_text("")
    out = run("--simulate", str(root), "--host-root", str(root), "cdi", "refresh")
    assert out.stdout.endswith(": unchanged\n")
    assert copy.read_bytes() == (Path(hostagent.__file__).parent / "hooks/main.py").read_bytes()
    assert not (copy.parent / "gone.py").exists()


def test_nvml_is_the_hosts_library_found_under_the_root_or_driver_root(make_node, tmp_path):
    host, _ = make_node("t4x2")
    root = host.root
    lib = root / LIB_DIR
    real = os.readlink(lib / "libnvidia-ml.so.1")
    (lib / "libnvidia-ml.so.1").unlink()                   # an absolute link, read as the host would
    (lib / "libnvidia-ml.so.1").symlink_to(f"/{LIB_DIR}/{real}")
    try:
        assert load_host_library(HostRoot.mounted_at(root)) == lib / real
        assert pynvml.nvmlLib._name == str(lib / real)
    finally:
        pynvml.nvmlLib = None
    # The simulator's library is an ELF with no code: loaded, it lacks NVML's functions.
    out = run("--host-root", str(root), "devices", check=False)
    assert out.returncode == 1
    assert out.stderr == (f"hostagent: error: {lib / real}: libnvidia-ml.so.1 has no nvmlInit_v2: it is not "
                          "NVIDIA's NVML library (check the driver root holds the NVIDIA driver's libraries)\n")
    # The driver's checks read the host's files and name them as the host does.
    out = run("--host-root", str(root), "driver", "verify", check=False)
    assert f"/{LIB_DIR}/{real}: user-space version" in out.stdout and str(root) not in out.stdout
    assert "NVML does not initialise: Function Not Found" in out.stdout
    # The GPU operator's layout: the driver in its own root on the host.
    other = tmp_path / "host"
    (other / "run/nvidia").mkdir(parents=True)
    os.rename(root, other / "run/nvidia/driver")
    out = run("--host-root", str(other), "--driver-root", "/run/nvidia/driver", "devices", check=False)
    assert f"{other}/run/nvidia/driver/{LIB_DIR}/{real}: libnvidia-ml.so.1 has no nvmlInit_v2" in out.stderr
    out = run("--host-root", str(other), "devices", check=False)
    assert out.stderr.startswith(f"hostagent: error: {other}: the NVML library libnvidia-ml.so.1 could not be loaded")
    assert "--driver-root" in out.stderr


def test_the_runtime_shim_is_not_written_from_a_container(tmp_path):
    out = run("--host-root", str(tmp_path), "runtime", "install-shim", check=False)
    assert out.returncode == 2 and "runtime configure --cdi" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_gpu_operators_layout_the_driver_in_its_own_root(make_node, tmp_path):
    """A host that is not a simulated node: its driver in /run/nvidia/driver (the driver
    container's root), the kernel's firmware path set to it. What a spec needs of the driver
    is found there, named by host paths, and mounted where the driver root puts it."""
    from hostagent.cdi.discover import Discovery
    from hostagent.cdi.spec import common_edits
    node, store = make_node("t4x2")
    version = store.facts.driver_version
    root = tmp_path / "host"
    (root / "run/nvidia").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")
    os.rename(node.root, root / "run/nvidia/driver")
    (root / "sys/module/firmware_class/parameters").mkdir(parents=True)
    (root / "sys/module/firmware_class/parameters/path").write_text("/var/run/nvidia/driver/lib/firmware\n")
    edits = common_edits(Discovery(HostRoot.mounted_at(root, "/run/nvidia/driver"), version))
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    assert mounts[f"/{LIB_DIR}/libcuda.so.{version}"] == f"/run/nvidia/driver/{LIB_DIR}/libcuda.so.{version}"
    assert mounts["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"
    assert mounts[f"/lib/firmware/nvidia/{version}/gsp_tu10x.bin"] == \
        f"/run/nvidia/driver/lib/firmware/nvidia/{version}/gsp_tu10x.bin"
    assert all(p.startswith("/run/nvidia/driver/") and resolve_within(root, p).is_file() for p in mounts.values())
    assert not [c for c in mounts if "nvidia/driver" in c]
    # A firmware folder of the kernel's outside the driver root: found through the host.
    os.rename(root / "run/nvidia/driver/lib/firmware", root / "opt")
    (root / "sys/module/firmware_class/parameters/path").write_text("/opt\n")
    edits = Discovery(HostRoot.mounted_at(root, "/run/nvidia/driver"), version).firmware()
    assert {m.container_path: m.host_path for m in edits.mounts}[f"/lib/firmware/nvidia/{version}/gsp_tu10x.bin"] == \
        f"/opt/nvidia/{version}/gsp_tu10x.bin"


def test_the_configuration_hostagent_config_names_is_the_daemons_and_the_clis(tmp_path):
    """A DaemonSet's agent reads its ConfigMap, not the host's /etc/hostagent/config.yaml:
    HOSTAGENT_CONFIG names it, and a CLI run beside it (kubectl exec) with the same variable
    finds the daemon through the socket that file names."""
    from hostagent.client import Client

    from .agentd import ABSENT_GROUP, make_root
    root = make_root()
    config = tmp_path / "configmap/config.yaml"
    config.parent.mkdir()
    config.write_text(json.dumps({"api": {"socket": "/run/hostagent/configmap.sock", "group": ABSENT_GROUP},
                                  "metrics": {"port": None}}))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HOSTAGENT_")}
    beside = {**clean, "HOSTAGENT_CONFIG": str(config)}
    daemon = subprocess.Popen([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "serve"],
                              env=beside, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        client = Client(socket_path=root / "run/hostagent/configmap.sock", timeout=2)
        until(lambda: _answers(client) or daemon.poll() is not None, 30, "answer from the daemon", interval=0.1)
        assert daemon.poll() is None, "the daemon exited"

        def status(env):
            return subprocess.run([script("hostagent"), "--simulate", str(root), "health", "status"],
                                  capture_output=True, text=True, timeout=60, env=env)
        found = status(beside)
        assert found.returncode == 0 and "healthy" in found.stdout, found.stderr
        alone = status(clean)                # the host's configuration: the default socket, no daemon
        assert alone.returncode != 0 and "no health monitor has published state" in alone.stderr
        assert HostRoot.from_env(str(root), simulator=simulator).config_file == root / "etc/hostagent/config.yaml"
    finally:
        daemon.terminate()
        daemon.wait(30)


def _answers(client) -> bool:
    from hostagent.client import DaemonNotRunning
    try:
        client.node()
        return True
    except DaemonNotRunning:
        return False
