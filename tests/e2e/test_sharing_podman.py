"""An MPS client container started by podman from its allocation's CDI spec reaches the
device's MPS control daemon: the daemon's socket at CUDA's default pipe directory, the
variables, the limits, and the shared /dev/shm the daemon's servers use. What root in that
container can do to the daemon's files, and to the agent, is tried too."""

import contextlib
import socket
import subprocess
import time
import uuid

import pytest

from hostagent.sharing import mps

from tests.integration.agentd import FAST, make_root, running_agent
from tests.integration.mpsprocs import alive, daemon_pid, running
from tests.waiting import until

from .conftest import PODMAN_FLAGS, host_cdi_spec

CONFIG = {"version": "v1", "sharing": {"mps": {"resources": [
    {"name": "nvidia.com/gpu", "devices": [0], "replicas": 2, "activeThreadPercentage": 40}]}}}
SUPERVISION = {**FAST, "sharing": {"probe_interval": 0.5, "probe_timeout": 2, "restart_backoff": 0.2,
                                   "restart_backoff_max": 1}}


@pytest.fixture
def agent():
    with running_agent(make_root("dgx-a100"), SUPERVISION) as proc:
        yield proc


@contextlib.contextmanager
def container(image: str, devices=(), flags=()):
    """A container that sleeps until removed: (its name, its init's pid on the host)."""
    name = f"hostagent-e2e-{uuid.uuid4().hex[:8]}"
    cmd = ["podman", "run", "-d", "--name", name, *PODMAN_FLAGS]
    for d in devices:
        cmd += ["--device", d]
    subprocess.run([*cmd, *flags, image, "sleep", "300"], check=True, capture_output=True, text=True, timeout=120)
    try:
        pid = subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", name], check=True,
                             capture_output=True, text=True).stdout.strip()
        yield name, int(pid)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)


def sh(name: str, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", name, "sh", "-c", script], capture_output=True, text=True, timeout=60)


def ask_through(path: str, command: str) -> str:
    """A command to the (simulated) control daemon through the socket at ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        data = b""
        while not data.endswith(b"\0"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.rstrip(b"\0").decode()


def test_an_mps_client_container_reaches_its_daemon_and_changes_nothing(podman_image, agent):
    with agent.client() as c:
        c.sharing_apply(CONFIG)
        replica = c.device("0")["replicas"][1]
        alloc_id = f"e2e-{uuid.uuid4().hex[:8]}"        # others may run containers here too
        alloc = c.allocate(alloc_id, [replica])
        spec_text = open(alloc["spec_path"]).read()
        (name,) = alloc["cdi_devices"]
        with host_cdi_spec(alloc["spec_path"].rsplit("/", 1)[1], spec_text), \
                container(podman_image, devices=[name]) as (ctr, pid):
            environ = open(f"/proc/{pid}/environ", "rb").read().decode()      # what CDI gave its process
            listed = sh(ctr, "ls -a /tmp/nvidia-mps; echo from-the-client > /dev/shm/probe").stdout
            # The daemon answers through the socket as the container sees it (its mounts).
            assert ask_through(f"/proc/{pid}/root/tmp/nvidia-mps/control", mps.PROBE) == "40.0"
            # Root in the container can neither change nor add anything there.
            tried = sh(ctr, "echo 1 > /tmp/nvidia-mps/nvidia-cuda-mps-control.pid; rm -f /tmp/nvidia-mps/control;"
                            " mkfifo /tmp/nvidia-mps/x; ln -s / /tmp/nvidia-mps/y; ls -a /tmp/nvidia-mps")
            assert tried.stderr.count("Read-only file system") == 4, tried.stderr
            assert tried.stdout.split() == [".", "..", "control"]
        # The client's /dev/shm is the shared tmpfs the daemon's servers use.
        assert (mps.shm_dir(agent.host) / "probe").read_text() == "from-the-client\n"
        c.release(alloc_id)
        c.sharing_apply(None)
    env = dict(item.split("=", 1) for item in environ.split("\0") if "=" in item)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"      # 40 GiB / 2 replicas
    # The daemon's socket and nothing else of its pipe directory.
    assert listed.split() == [".", "..", "control"]


def test_root_in_a_container_with_the_pipe_directory_cannot_steer_the_agent(podman_image, agent):
    """A container that has the daemon's pipe directory read-write (as other plugins mount
    it) writes a host process's pid in the pid file, makes the pid file a FIFO and removes
    the socket: the agent kills nothing but the daemon it recorded, never hangs, and starts
    a new daemon in a new pipe directory the container no longer reaches."""
    victim = subprocess.Popen(["sleep", "300"])
    try:
        with agent.client() as c:
            c.sharing_apply(CONFIG)
            gpu = c.device("0")["uuid"]
            before = next(d for d in c.sharing()["devices"] if d["uuid"] == gpu)["mps"]
            pipe = mps.pipe_dir(agent.host, gpu)
            with container(podman_image, flags=["-v", f"{pipe}:/tmp/nvidia-mps"]) as (ctr, _):
                tried = sh(ctr, f"cd /tmp/nvidia-mps && echo {victim.pid} > nvidia-cuda-mps-control.pid && "
                                "rm control && rm nvidia-cuda-mps-control.pid && mkfifo nvidia-cuda-mps-control.pid")
                assert tried.returncode == 0, tried.stderr
                daemon = lambda: next(d for d in c.sharing()["devices"] if d["uuid"] == gpu)["mps"]
                now = until(lambda: (m := daemon())["state"] == "ready" and m["pid"] != before["pid"] and m, 20,
                            lambda: f"the daemon is not replaced: {daemon()}", interval=0.1)
                assert victim.poll() is None and not alive(before["pid"])
                assert now["pid"] == daemon_pid(agent.host, gpu) and mps.probe(agent.host, gpu)
                # The container's mount holds the old directory: nothing it writes reaches the new one.
                sh(ctr, f"echo {victim.pid} > /tmp/nvidia-mps/nvidia-cuda-mps-control.pid")
                assert not (pipe / "nvidia-cuda-mps-control.pid").read_text().strip() == str(victim.pid)
            started = time.monotonic()
            c.sharing_apply(None)
            assert time.monotonic() - started < 15
        assert victim.poll() is None and running(agent.root) == []
    finally:
        victim.kill()
        victim.wait()
