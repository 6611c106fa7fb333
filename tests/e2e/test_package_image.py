"""The container image, built from the deb on a Debian 12 base with no registry, run with
podman against a simulated node as the DaemonSet runs it."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from hostagent import __version__
from hostagent.client import Client
from hostagent.sim.platform import simulated_host
from tests.waiting import until

from ..programs import script
from .conftest import PODMAN_FLAGS
from .packages import build

pytestmark = [pytest.mark.root("podman builds and runs the image as root here"), pytest.mark.engine]


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


def wait_for(path: Path, container: str, timeout: float = 60) -> Path:
    """``path``, once the agent in ``container`` has made it (its log if it never does)."""
    until(lambda: path.exists(), timeout, lambda: podman("logs", container).stderr, interval=0.2)
    return path


def test_image_is_tagged_with_the_version_and_runs_the_agent_on_a_simulated_node(image, sim_node):
    assert image == f"localhost/hostagent:{__version__}"
    labels = json.loads(podman("image", "inspect", "-f", "{{json .Labels}}", image).stdout)
    # The agent unless given a command: any program of the package runs as it is.
    assert podman("run", "--rm", *PODMAN_FLAGS, image, "hostagent", "--version").stdout == f"hostagent {__version__}\n"
    assert labels["org.opencontainers.image.version"] == __version__

    name = f"hostagent-image-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *PODMAN_FLAGS, "-v", f"{sim_node}:{sim_node}",
           "-e", f"HOSTAGENT_SIMULATE={sim_node}", image)
    try:
        socket = wait_for(sim_node / "run/hostagent/hostagent.sock", name)
        # The agent in the container answers the host's client on the shared socket.
        with Client.for_host(simulated_host(sim_node), timeout=10) as client:
            node = client.node()
        assert node["agent"]["version"] == __version__ and node["gpus"] == 2
        assert podman("exec", name, "hostagentd", "--check").returncode == 0
        # No group of its own whose id could be another group on the node.
        assert podman("exec", name, "getent", "group", "hostagent", check=False).returncode == 2
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


DAEMONSET = Path(__file__).resolve().parents[2] / "packaging/kubernetes/base/daemonset.yaml"
CONFIGMAP = DAEMONSET.with_name("configmap.yaml")


def daemonset_agent():
    """The agent container of the DaemonSet and the host paths of its volumes."""
    import yaml
    pod = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    return pod["containers"][0], host_paths


def for_this_machine(spec: dict, tree: Path, vendor: str) -> dict:
    """The spec as this machine's engines need it when the host's / is ``tree``: every host
    path it names (mounts, nodes, the hook and its import path) found under ``tree``."""
    import re
    spec = json.loads(json.dumps(spec))
    spec["kind"] = f"{vendor}/gpu"
    for edits in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]:
        for m in edits.get("mounts", ()):
            m["hostPath"] = f"{tree}{m['hostPath']}"
        for n in edits.get("deviceNodes", ()):
            n["hostPath"] = f"{tree}{n.get('hostPath', n['path'])}"
        for h in edits.get("hooks", ()):
            h["args"] = [re.sub(r"sys\.path\.append\('(/[^']*)'\)", lambda m: f"sys.path.append('{tree}{m[1]}')", a)
                         for a in h["args"]]
            h["path"] = h["args"][0] = f"{tree}{h['path']}"
    return spec


def test_the_daemonset_agent_serves_a_host_mounted_at_host_with_specs_of_host_paths(image, podman_image, tmp_path):
    """The DaemonSet's agent container (its mounts, environment and configuration) on a host
    whose / is ``tree``: a Debian-like tree that is not the machine's root (its /var/run ->
    /run), with the simulator's driver in it. The spec it writes names host paths; with
    those found under ``tree``, a container on this machine starts with the GPU, the
    driver's libraries and the links the hook (the host's copy, by the host's python3)
    makes."""
    import yaml
    from .conftest import host_cdi_spec, podman_run
    tree = tmp_path / "host"
    subprocess.run([script("hostagent"), "sim", "create", "--profile", "t4x2", "--root", str(tree)], check=True,
                   capture_output=True)
    (tree / "var").mkdir()
    (tree / "var/run").symlink_to("/run")
    (tree / "usr/bin/python3").write_text("#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n")
    (tree / "usr/bin/python3").chmod(0o755)
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.yaml").write_text(yaml.safe_load(CONFIGMAP.read_text())["data"]["config.yaml"])

    agent, host_paths = daemonset_agent()
    flags = ["-v", f"{config}:/etc/hostagent:ro", "-v", f"{tree / '.sim'}:/host/.sim"]   # the simulator's state
    for m in agent["volumeMounts"]:
        if m["name"] in host_paths and m["mountPath"] != "/dev":    # this machine's /dev stays its own
            (tree / host_paths[m["name"]].lstrip("/")).mkdir(parents=True, exist_ok=True)   # DirectoryOrCreate
            flags += ["-v", f"{tree}{host_paths[m['name']]}:{m['mountPath']}" + (":ro" if m.get("readOnly") else "")]
    flags += [a for e in agent["env"] for a in ("-e", f"{e['name']}={e['value']}")]
    name = f"hostagent-hostroot-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *PODMAN_FLAGS, *flags, "-e", "HOSTAGENT_SIMULATE=/host", image, *agent.get("args", ()))
    try:
        written = wait_for(tree / "run/cdi/nvidia.com-gpu.json", name)
        assert podman("exec", name, "hostagentd", "--check").returncode == 0
        assert (tree / "run/nvidia/validations/driver-ready").read_text().startswith("# written by hostagent\nIS_HOST_DRIVER=true\n")
    finally:
        podman("rm", "-f", "-t", "10", name, check=False)
    spec = json.loads(written.read_text())
    text = json.dumps(spec)
    assert "/host/" not in text and str(tree) not in text
    [hook] = spec["containerEdits"]["hooks"]
    assert hook["path"] == "/usr/bin/python3"

    vendor = f"e2e-{uuid.uuid4().hex[:8]}.hostagent.test"
    with host_cdi_spec(f"{vendor}-gpu.json", json.dumps(for_this_machine(spec, tree, vendor))):
        out = podman_run(podman_image, "sh", "-c",
                         "stat -c '%F %t:%T' /dev/nvidia0; readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1; "
                         "ldconfig -p | grep -c libnvidia-ml.so.1", devices=[f"{vendor}/gpu=0"]).stdout
    version = json.loads((tree / ".sim/node.json").read_text())["driver_version"]
    assert out.splitlines() == ["character special file c3:0", f"libcuda.so.{version}", "1"], out


def test_the_simulated_overlays_agent_makes_its_node_and_answers(image, tmp_path):
    """The agent's pod of packaging/kubernetes/simulated as kustomize renders it (its init
    container, then the agent with its environment and mounts), each host path a folder
    of ``tmp_path``: the node is made, the agent serves it unprivileged, and a client on the
    host's side of the /run/hostagent mount (where the device plugin looks) gets its 8 GPUs."""
    import yaml
    rendered = subprocess.run([script("kubectl"), "kustomize", str(DAEMONSET.parents[1] / "simulated")],
                              capture_output=True, text=True, check=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.yaml"]
    host = {v["name"]: tmp_path / v["hostPath"]["path"].strip("/") for v in pod["volumes"] if "hostPath" in v}
    for folder in host.values():
        folder.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config").mkdir()
    # The port is the pod's own in the cluster; here it shares this machine's network.
    (tmp_path / "config/config.yaml").write_text(config.replace("port: 9400", "port: null"))
    host["config"] = tmp_path / "config"

    def flags(container):
        out = []
        for m in container["volumeMounts"]:
            out += ["-v", f"{host[m['name']]}:{m['mountPath']}" + (":ro" if m.get("readOnly") else "")]
        return out + [a for e in container.get("env", ()) for a in ("-e", f"{e['name']}={e['value']}")]

    [init] = pod["initContainers"]
    podman("run", "--rm", *PODMAN_FLAGS, *flags(init), image, *init["command"])
    assert (host["simulated-node"] / ".sim/node.json").exists()
    agent = pod["containers"][0]
    assert "command" not in agent and agent["securityContext"]["privileged"] is False
    name = f"hostagent-simulated-{uuid.uuid4().hex[:8]}"
    podman("run", "-d", "--name", name, *PODMAN_FLAGS, *flags(agent), image)
    try:
        socket = wait_for(host["run-hostagent"] / "hostagent.sock", name)
        with Client(socket_path=socket, timeout=10) as client:
            node = client.node()
        assert node["gpus"] == 8 and node["agent"]["version"] == __version__
        # The probes' command, as the kubelet runs it in the container.
        check = podman("exec", name, *agent["livenessProbe"]["exec"]["command"], check=False)
        assert check.returncode == 0, check.stderr
        # The node's labels, where NFD's worker reads them.
        labels = (host["nfd-features"] / "hostagent").read_text()
        assert "nvidia.com/gpu.count=8" in labels and "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB" in labels
        # Its CDI spec, where the host's runtime reads it: the node's files by the paths the
        # host knows them by, and no hook (the host has no python3 or hostagent to run it).
        spec = json.loads(wait_for(host["cdi-dynamic"] / "nvidia.com-gpu.json", name).read_text())
        assert '"hooks"' not in json.dumps(spec)
        nodes = [n for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
        assert len(nodes) >= 8 and all(n["hostPath"].startswith("/var/lib/hostagent-sim/dev/") for n in nodes)
        # A second start (the pod restarted) keeps the node it made.
        podman("run", "--rm", *PODMAN_FLAGS, *flags(init), image, *init["command"])
        with Client(socket_path=socket, timeout=10) as client:
            assert client.node()["gpus"] == 8
    finally:
        podman("rm", "-f", "-t", "10", name, check=False)
