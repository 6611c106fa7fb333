"""The container image, built from the deb on a Debian 12 base with no registry, run with
podman against a simulated node as the DaemonSet runs it."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from hostagent import __version__
from hostagent.client import Client
from hostagent.hostroot import HostRoot

from ..programs import script
from .conftest import PODMAN_FLAGS
from .packages import build

pytestmark = [pytest.mark.root, pytest.mark.engine]


@pytest.fixture(scope="module")
def image(tmp_path_factory, deb_package, debian_image):
    out = tmp_path_factory.mktemp("image")
    done = build("image", out, "--deb", str(deb_package), "--base", debian_image, output=False)
    tag = done.stdout.strip().splitlines()[-1]
    image_id = subprocess.run(["podman", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True,
                              text=True, check=True).stdout.strip()
    yield tag
    subprocess.run(["podman", "rmi", image_id], capture_output=True)


@pytest.fixture
def sim_node(tmp_path):
    root = tmp_path / "node"
    subprocess.run([script("hostagent"), "sim", "create", "--profile", "t4x2", "--root", str(root)], check=True,
                   capture_output=True)
    return root


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    assert not check or done.returncode == 0, done.stderr
    return done


def test_image_is_tagged_with_the_version_and_runs_the_agent_on_a_simulated_node(image, sim_node):
    assert image == f"localhost/hostagent:{__version__}"
    labels = json.loads(podman("image", "inspect", "-f", "{{json .Labels}}", image).stdout)
    assert labels["org.opencontainers.image.version"] == __version__

    name = f"hostagent-image-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *PODMAN_FLAGS, "-v", f"{sim_node}:{sim_node}",
           "-e", f"HOSTAGENT_SIMULATE={sim_node}", image)
    try:
        socket = sim_node / "run/hostagent/hostagent.sock"
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert time.monotonic() < deadline, podman("logs", name).stderr
            time.sleep(0.2)
        # The agent in the container answers the host's client on the shared socket.
        with Client.for_host(HostRoot.simulation(sim_node), timeout=10) as client:
            node = client.node()
        assert node["agent"]["version"] == __version__ and node["gpus"] == 2
        assert podman("exec", name, "hostagentd", "--check").returncode == 0
        # The DaemonSet's second container: the device plugin's gRPC is in the image too.
        assert "--plugin-dir" in podman("exec", name, "hostagent", "device-plugin", "--help").stdout
        as_root = json.loads(podman("exec", name, "hostagent", "devices", "-o", "json").stdout)
        nobody = json.loads(podman("exec", "--user", "65534:65534", name, "hostagent", "devices", "-o",
                                   "json").stdout)
        assert [g["uuid"] for g in as_root["gpus"]] == [g["uuid"] for g in nobody["gpus"]] and len(nobody["gpus"]) == 2

        podman("stop", "-t", "30", name)
        assert podman("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "0"
        assert not socket.exists()
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)
