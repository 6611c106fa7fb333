"""An MPS client container started by podman from its allocation's CDI spec reaches the
device's MPS control daemon: the pipe directory at CUDA's default path, the variables, the
limits, and the shared /dev/shm the daemon's servers use."""

import uuid

import pytest

from hostagent.sharing import mps

from tests.integration.agentd import FAST, AgentProcess, make_root

from .conftest import host_cdi_spec, podman_run

CONFIG = {"version": "v1", "sharing": {"mps": {"resources": [
    {"name": "nvidia.com/gpu", "devices": [0], "replicas": 2, "activeThreadPercentage": 40}]}}}


@pytest.fixture
def agent():
    proc = AgentProcess(make_root("dgx-a100"), FAST).start()
    yield proc
    try:
        proc.stop()
    finally:
        proc.cleanup()


def test_an_mps_client_container_reaches_its_daemon(podman_image, agent):
    with agent.client() as c:
        c.sharing_apply(CONFIG)
        replica = c.device("0")["replicas"][1]
        alloc_id = f"e2e-{uuid.uuid4().hex[:8]}"        # others may run containers here too
        alloc = c.allocate(alloc_id, [replica])
        spec_text = open(alloc["spec_path"]).read()
        (name,) = alloc["cdi_devices"]
        with host_cdi_spec(alloc["spec_path"].rsplit("/", 1)[1], spec_text):
            out = podman_run(podman_image, "sh", "-c",
                             "env; ls /tmp/nvidia-mps; echo from-the-client > /dev/shm/probe",
                             devices=[name]).stdout
        # The client's /dev/shm is the shared tmpfs the daemon's servers use.
        assert (mps.shm_dir(agent.host) / "probe").read_text() == "from-the-client\n"
        c.release(alloc_id)
        c.sharing_apply(None)
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"      # 40 GiB / 2 replicas
    # The daemon's pipe directory, as the daemon sees it: its socket and pid file.
    assert {"control", "nvidia-cuda-mps-control.pid"} <= set(out.split())
