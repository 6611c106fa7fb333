"""The features file the real daemon writes, against gpu-feature-discovery's label catalog
(shared/reference/mps-health-labels.md section 3, and GFD's expected-output files): the
full key set and each value's format, for an A100 node under the mixed and the single
strategy and for a T4 node; and ``hostagent labels`` beside the daemon."""

import contextlib
import re
import subprocess
import sys

import pytest

from hostagent.labels import FEATURES_FILE, TIMESTAMP, parse
from tests.rootneeds import GPU_CHANGES

from .agentd import make_root, running_agent
from .test_labels import assert_kubernetes_labels

CLI = [sys.executable, "-m", "hostagent.cli.main"]
P = "nvidia.com/"
NUM = r"[0-9]+"

# Every node with GPUs: key -> value format. (gpu.clique needs fabric-attached GPUs and
# vgpu.* vGPU devices: the simulated nodes have neither, and GFD then omits them.)
COMMON = {
    TIMESTAMP: r"[0-9]{10}",
    "cuda.driver.major": NUM, "cuda.driver.minor": NUM, "cuda.driver.rev": r"[0-9]*",
    "cuda.driver-version.major": NUM, "cuda.driver-version.minor": NUM,
    "cuda.driver-version.revision": r"[0-9]*", "cuda.driver-version.full": r"[0-9]+\.[0-9]+(\.[0-9]+)?",
    "cuda.runtime.major": NUM, "cuda.runtime.minor": NUM,
    "cuda.runtime-version.major": NUM, "cuda.runtime-version.minor": NUM,
    "cuda.runtime-version.full": r"[0-9]+\.[0-9]+",
    "gpu.machine": r".+", "gpu.product": r"[A-Za-z0-9_.-]+", "gpu.count": NUM, "gpu.replicas": NUM,
    "gpu.sharing-strategy": r"none|mps|time-slicing", "gpu.memory": NUM,
    "gpu.family": r"tesla|fermi|kepler|maxwell|pascal|volta|turing|ampere|ada-lovelace|hopper|blackwell|rubin|undefined",
    "gpu.compute.major": NUM, "gpu.compute.minor": NUM, "gpu.mode": r"compute|graphics|unknown",
    "mig.capable": r"true|false", "mps.capable": r"true|false",
}
MIG_ATTRIBUTES = {"memory": NUM, "multiprocessors": NUM, "slices.gi": NUM, "slices.ci": NUM,
                  "engines.copy": NUM, "engines.decoder": NUM, "engines.encoder": NUM,
                  "engines.jpeg": NUM, "engines.ofa": NUM}
MIG_RESOURCE = {"product": r"[A-Za-z0-9_.-]+-MIG-[0-9a-z.]+", "count": NUM, "replicas": NUM,
                "sharing-strategy": r"none|mps|time-slicing", **MIG_ATTRIBUTES}


def catalog(strategy="none", profiles=()) -> dict:
    """Key -> value format GFD publishes for a node under ``strategy`` with MIG devices of
    ``profiles`` (GFD's names: '+' spelled '.')."""
    out = {k if k.startswith(P) else P + k: v for k, v in COMMON.items()}
    if strategy != "none":
        out[P + "mig.strategy"] = strategy
    if strategy == "single":
        out.update({f"{P}gpu.{k}": v for k, v in MIG_ATTRIBUTES.items()})
    if strategy == "mixed":
        out.update({f"{P}mig-{p}.{k}": v for p in profiles for k, v in MIG_RESOURCE.items()})
    return out


def assert_catalog(labels, strategy="none", profiles=()):
    want = catalog(strategy, profiles)
    assert sorted(labels) == sorted(want)
    for key, value in labels.items():
        assert re.fullmatch(want[key], value), (key, value)
    assert_kubernetes_labels(labels)


def daemon(agents, profile, labels, layout=None):
    """A daemon with this ``labels:`` section (stopped by the ``agents`` fixture), after
    applying ``layout``; returns it and its features file, checked to be what it serves."""
    agent = agents.enter_context(running_agent(make_root(profile), {
        "daemon": {"resync_interval": 0}, "labels": labels, "health": {"enabled": False}, "metrics": {"port": None}}))
    if layout:
        with agent.client() as c:
            c.request("POST", "/v1/mig/apply", {"config": "t", "spec": {"version": "v1", "mig-configs": {"t": layout}}})
    text = agent.host.host(FEATURES_FILE).read_text()
    with agent.client() as c:
        assert c.labels()["labels"] == parse(text) and text.endswith("\n")
    return agent, parse(text)


def cli(agent, *args):
    return subprocess.run(CLI + ["--simulate", str(agent.root), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def agents():
    """Where a test's daemons are kept: each stopped and removed at its end."""
    with contextlib.ExitStack() as stack:
        yield stack


@GPU_CHANGES
def test_a100_node_mixed_strategy(agents):
    agent, labels = daemon(agents, "dgx-a100", {"mig_strategy": "mixed"}, [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
        {"devices": [2], "mig-enabled": True, "mig-devices": {"1g.5gb+me": 1}},
        {"devices": [3, 4, 5, 6, 7], "mig-enabled": False}])
    assert_catalog(labels, "mixed", ["1g.5gb", "3g.20gb", "1g.5gb.me"])
    assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB" and labels[P + "gpu.count"] == "8"
    assert labels[P + "gpu.replicas"] == "1" and labels[P + "gpu.memory"] == "40960"
    assert labels[P + "mig-1g.5gb.count"] == "7" and labels[P + "mig-3g.20gb.count"] == "2"
    assert labels[P + "mig-1g.5gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    assert labels[P + "mig-3g.20gb.slices.gi"] == "3" and labels[P + "mig-1g.5gb.me.engines.jpeg"] == "1"
    assert labels[P + "gpu.machine"] == "DGXA100-920-23687-2530-000" and labels[P + "mig.capable"] == "true"
    # the command shows the daemon's labels (not its own defaults), and leaves the file to it
    out = cli(agent, "labels")
    assert out.returncode == 0 and parse(out.stdout) == labels
    assert P + "mig.strategy" not in parse(cli(agent, "labels", "--mig-strategy", "none").stdout)
    before = agent.host.host(FEATURES_FILE).stat().st_mtime_ns
    out = cli(agent, "labels", "--write")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "daemon keeps the features file" in out.stderr
    assert "labels: section" in out.stderr and FEATURES_FILE in out.stderr
    assert agent.host.host(FEATURES_FILE).stat().st_mtime_ns == before


@GPU_CHANGES
def test_a100_node_single_strategy(agents):
    agent, labels = daemon(agents, "dgx-a100", {"mig_strategy": "single"}, [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}])
    assert_catalog(labels, "single")
    assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert (labels[P + "gpu.count"], labels[P + "gpu.replicas"], labels[P + "gpu.memory"]) == ("16", "1", "19968")
    assert (labels[P + "gpu.slices.gi"], labels[P + "gpu.multiprocessors"]) == ("3", "42")
    assert labels[P + "gpu.family"] == "ampere" and labels[P + "mig.strategy"] == "single"


def test_t4_node(agents):
    agent, labels = daemon(agents, "t4x2", {"sharing_strategy": "time-slicing", "replicas": 4})
    assert_catalog(labels)
    assert labels[P + "gpu.product"] == "Tesla-T4-SHARED" and labels[P + "gpu.count"] == "2"
    assert labels[P + "gpu.replicas"] == "4" and labels[P + "gpu.sharing-strategy"] == "time-slicing"
    assert (labels[P + "gpu.family"], labels[P + "gpu.compute.major"], labels[P + "gpu.compute.minor"]) == \
        ("turing", "7", "5")
    assert labels[P + "gpu.memory"] == "15360" and labels[P + "mig.capable"] == "false"
    assert labels[P + "cuda.driver-version.full"] == "535.183.01"
