"""NVIDIA's DRA demo claims on a simulated node, as packaging/kubernetes/simulated/dra runs it
on a cluster without GPUs, with a real runtime: the agent with that overlay's configuration
and the host's CDI folder mounted where the overlay mounts it, the DRA plugin preparing each
claim as the suite's kubelet asks (allocated by its scheduler, in its API server), then each
pod's container started by podman 4.3.1 with the CDI names the plugin answered, as a node's
runtime starts it."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from hostagent.sim.platform import simulated_host
from tests.programs import script

from .conftest import podman_run, require

pytestmark = [pytest.mark.root("podman and the agent's mount of the host's CDI folder need root here"),
              pytest.mark.engine]

OVERLAY = Path(__file__).resolve().parents[2] / "packaging/kubernetes/simulated/dra"
# A container's NVIDIA device nodes (major:minor in hex) and the variables CDI gave it.
PROBE = ("for f in /dev/nvidia*; do [ -c \"$f\" ] && echo \"node $f $(stat -c '%t:%T' $f)\"; done; "
         "env | grep -E '^(NVIDIA_VISIBLE_DEVICES=|CUDA_MPS_)' | sort")


def overlay_agent() -> tuple[dict, str]:
    """The agent of the overlay as kustomize renders it: (its configuration, the host folder
    mounted as the CDI folder of the node it runs on in its pod)."""
    done = subprocess.run([script("kubectl"), "kustomize", str(OVERLAY)], capture_output=True, text=True,
                          timeout=120, check=True)
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hostagent-config")
    pod = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hostagent")
    pod = pod["spec"]["template"]["spec"]
    agent = next(c for c in pod["containers"] if c["name"] == "hostagent")
    node = next(e["value"] for e in agent["env"] if e["name"] == "HOSTAGENT_SIMULATE")
    cdi_dir = str(simulated_host(node).cdi_dir)
    [mount] = [m for m in agent["volumeMounts"] if m["mountPath"] == cdi_dir]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return yaml.safe_load(config["data"]["config.yaml"]), volume["hostPath"]["path"]


@contextlib.contextmanager
def host_cdi_folder(path: str):
    """The host's CDI folder for the block: made if missing (removed again if then empty),
    and the agent's files in it removed afterwards. A host whose folder already holds
    hostagent's specs (a GPU node's own) is not touched."""
    folder = Path(path)
    if folder.is_dir() and [p for p in folder.iterdir() if p.name == "nvidia.com-gpu.json"
                            or p.name.startswith("hostagent.io-allocation_")]:
        pytest.skip(f"{folder} holds hostagent's CDI specs of this machine")
    made = not folder.exists()
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        for spec in [folder / "nvidia.com-gpu.json", *folder.glob("hostagent.io-allocation_*.json")]:
            spec.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()


@pytest.fixture
def cluster():
    """The one-node test cluster, its agent configured as the overlay's and writing its CDI
    specs into the host's folder through a mount of its own (unshare: gone with it), as the
    overlay's hostPath volume does."""
    from tests.integration.dracluster import AGENT, Cluster
    require("podman", "runc", "unshare", "mount")
    config, host_folder = overlay_agent()
    # The overlay's metrics port is its pod's own; here it would be this machine's.
    config = {**AGENT, **{k: v for k, v in config.items() if k != "metrics"}}
    with host_cdi_folder(host_folder) as folder:
        test_cluster = Cluster(agent_config=config)
        try:
            cdi_dir = test_cluster.agent.host.cdi_dir
            cdi_dir.mkdir(parents=True)                   # the mount point, as the runtime makes it
            test_cluster.agent.prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                         'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
                                         str(folder), str(cdi_dir)]
            test_cluster.start()
            test_cluster.kubelet.plugin()                 # registered with the kubelet
            yield test_cluster, folder
        finally:
            test_cluster.close()


def run(image: str, cdi_names) -> tuple[dict[str, str], dict[str, str]]:
    """What a container given ``cdi_names`` sees: its NVIDIA device nodes (path: major:minor)
    and its NVIDIA_VISIBLE_DEVICES and CUDA_MPS_* variables."""
    out = podman_run(image, "sh", "-c", PROBE, devices=cdi_names).stdout
    nodes = {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("node ")}
    env = dict(line.split("=", 1) for line in out.splitlines() if not line.startswith("node "))
    return nodes, env


def prepare(cluster, claim, published) -> tuple[str, tuple[str, ...], int]:
    """The plugin's answer for a claim of one device: (the device, its CDI names, the minor
    number of its /dev/nvidia<minor> as the agent knows it)."""
    [(prepared, error)] = cluster.kubelet.prepare(claim).values()
    assert not error
    [(_, _, device, cdi)] = prepared
    with cluster.agent.client() as client:
        minor = client.device(published[device]["attributes"]["uuid"]["string"])["minor"]
    return device, cdi, minor


def check_runnable_on_the_node(spec: dict, node: Path) -> None:
    """A spec the node's runtime applies as it is: no hook (the node has no python3 or
    hostagent to run it), and every host path it names is the node's and exists."""
    assert '"hooks"' not in json.dumps(spec)
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    paths = [n["hostPath"] for e in edits for n in e.get("deviceNodes", ())]
    paths += [m["hostPath"] for e in edits for m in e.get("mounts", ())]
    assert paths and all(p.startswith(f"{node}/") and Path(p).exists() for p in paths), paths


def gpus(nodes: dict[str, str]) -> dict[str, str]:
    return {path: numbers for path, numbers in nodes.items() if path[len("/dev/nvidia"):].isdigit()}


def test_nvidias_gpu_test1_runs_its_pods_containers_on_simulated_gpus(podman_image, cluster):
    """Two pods, a GPU each, by the node spec's names."""
    from tests.integration.dracluster import quickstart
    cluster, folder = cluster
    published = cluster.devices()
    claims = cluster.allocate(cluster.claims(quickstart()["gpu-test1"]))
    try:
        check_runnable_on_the_node(json.loads((folder / "nvidia.com-gpu.json").read_text()), cluster.root)
        given = []
        for claim in claims:
            device, cdi, minor = prepare(cluster, claim, published)
            assert cdi == (f"nvidia.com/gpu={published[device]['attributes']['uuid']['string']}",)
            nodes, env = run(podman_image, cdi)
            # Its GPU's device node as the node has it, and no other GPU's; the control node.
            assert gpus(nodes) == {f"/dev/nvidia{minor}": f"c3:{minor:x}"}, nodes
            assert nodes["/dev/nvidiactl"] == "c3:ff"
            # The spec's variable: a legacy NVIDIA hook in the runtime leaves the container alone.
            assert env == {"NVIDIA_VISIBLE_DEVICES": "void"}
            given.append(device)
        assert len(set(given)) == 2
    finally:
        cluster.forget(claims)


def test_nvidias_mps_claim_runs_its_container_from_the_claims_own_spec(podman_image, cluster):
    """gpu-test-mps: the claim's device comes with its MPS daemon's pipe and limits, in a
    transient spec of its own beside the node's, gone with the claim."""
    from tests.integration.dracluster import quickstart
    cluster, folder = cluster
    published = cluster.devices()
    [claim] = cluster.allocate(cluster.claims(quickstart()["gpu-test-mps"]))
    try:
        _, cdi, minor = prepare(cluster, claim, published)
        [(kind, name)] = [n.split("=") for n in cdi]
        [path] = folder.glob(f"{kind.replace('/', '-')}_*.json")
        spec = json.loads(path.read_text())
        assert [d["name"] for d in spec["devices"]] == [name]
        check_runnable_on_the_node(spec, cluster.root)
        nodes, env = run(podman_image, cdi)
        assert gpus(nodes) == {f"/dev/nvidia{minor}": f"c3:{minor:x}"}, nodes
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    finally:
        cluster.forget([claim])
    assert not list(folder.glob("hostagent.io-allocation_*.json"))
