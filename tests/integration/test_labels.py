"""GFD-compatible labels from simulated nodes."""

import os
import re
import subprocess
import sys

import pytest

from hostagent.devices import read_inventory
from hostagent.labels import FEATURES_FILE, Sharing, node_labels, render, write_labels
from hostagent.labels.gfd import gpu_family, sanitise
from hostagent.labels.hostfacts import gpu_mode, machine_type
from hostagent.sim.node import MIG_ENABLE

P = "nvidia.com/"


def layout(store, gpus, profiles):
    """Enable MIG on ``gpus`` and create one GI+full CI per profile id in ``profiles``."""
    with store.mutate() as s:
        for g in gpus:
            s.set_mig_mode(store.facts, g, MIG_ENABLE)
            s.reset_gpu(g)
            for pid in profiles:
                gi = s.create_gi(store.facts, g, pid)
                prof = store.facts.skus[s.gpus[g].sku].mig.by_id(pid)
                s.create_ci(store.facts, g, gi.id, max(prof.ci_profiles, key=lambda c: c.slices).id)


def test_whole_gpu_labels(make_node):
    host, _ = make_node("dgx-a100")
    inv = read_inventory(host)
    labels = node_labels(inv, machine=machine_type(host), gpu_mode=gpu_mode(host, inv), timestamp=1700000000)
    assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels[P + "gpu.count"] == "8" and labels[P + "gpu.memory"] == "40960"
    assert labels[P + "gpu.family"] == "ampere" and labels[P + "gpu.compute.major"] == "8"
    assert labels[P + "gpu.machine"] == "DGXA100-920-23687-2530-000"
    assert labels[P + "gpu.mode"] == "compute" and labels[P + "gfd.timestamp"] == "1700000000"
    assert labels[P + "cuda.driver-version.full"] == "550.90.07" and labels[P + "cuda.driver.rev"] == "07"
    assert labels[P + "cuda.runtime-version.full"] == "12.4"
    assert labels[P + "mig.capable"] == "true" and P + "mig.strategy" not in labels
    assert labels[P + "gpu.replicas"] == "1" and labels[P + "gpu.sharing-strategy"] == "none"
    for k, v in labels.items():     # NFD: label keys and values must be valid
        assert re.fullmatch(r"[a-z0-9.\-/]+", k) and re.fullmatch(r"[A-Za-z0-9._\-]*", v), (k, v)


def test_sharing_labels(make_node):
    host, _ = make_node("t4x2")
    inv = read_inventory(host)
    labels = node_labels(inv, sharing=Sharing("time-slicing", 4))
    assert labels[P + "gpu.product"] == "Tesla-T4-SHARED" and labels[P + "gpu.replicas"] == "4"
    assert labels[P + "gpu.sharing-strategy"] == "time-slicing" and labels[P + "gpu.family"] == "turing"
    assert labels[P + "mig.capable"] == "false"
    renamed = node_labels(inv, sharing=Sharing("mps", 2, rename_by_default=True))
    assert renamed[P + "gpu.product"] == "Tesla-T4" and renamed[P + "mps.capable"] == "true"


def test_single_strategy(make_node):
    host, store = make_node("dgx-a100")
    layout(store, range(8), [19, 19])          # two 1g.5gb everywhere
    labels = node_labels(read_inventory(host), mig_strategy="single")
    assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels[P + "gpu.count"] == "16" and labels[P + "gpu.memory"] == "4864"
    assert labels[P + "gpu.multiprocessors"] == "14" and labels[P + "gpu.slices.gi"] == "1"
    assert labels[P + "gpu.engines.copy"] == "1" and labels[P + "mig.strategy"] == "single"


@pytest.mark.parametrize("case", ["mixed-profiles", "mig-and-full", "empty-mig-gpu"])
def test_single_strategy_invalid(make_node, case):
    host, store = make_node("dgx-a100")
    if case == "mixed-profiles":
        layout(store, range(8), [19])
        with store.mutate() as s:               # one 3g.20gb beside the 1g.5gb on GPU 0
            gi = s.create_gi(store.facts, 0, 9)
            s.create_ci(store.facts, 0, gi.id, 2)
    elif case == "mig-and-full":
        layout(store, range(4), [19])
    else:
        layout(store, range(7), [19])
        layout(store, [7], [])
    labels = node_labels(read_inventory(host), mig_strategy="single")
    assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert (labels[P + "gpu.count"], labels[P + "gpu.replicas"], labels[P + "gpu.memory"]) == ("0", "0", "0")
    assert labels[P + "gpu.sharing-strategy"] == ""


def test_mixed_strategy(make_node):
    host, store = make_node("mixed")
    layout(store, [0], [9, 9])                # 2x 3g.40gb on the first A100-80GB
    layout(store, [1], [0])                   # 7g.80gb on the second
    labels = node_labels(read_inventory(host), mig_strategy="mixed")
    assert labels[P + "mig-3g.40gb.count"] == "2" and labels[P + "mig-7g.80gb.count"] == "1"
    assert labels[P + "mig-3g.40gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
    assert labels[P + "mig-3g.40gb.memory"] == "40192" and labels[P + "mig-3g.40gb.slices.ci"] == "3"
    assert labels[P + "mig-7g.80gb.engines.ofa"] == "1"
    assert labels[P + "gpu.product"] == "Tesla-T4" and labels[P + "gpu.count"] == "1"


def test_family_and_sanitise():
    assert [gpu_family(*cc) for cc in ((7, 0), (7, 5), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (13, 0), (99, 0))] == \
        ["volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell", "blackwell", "rubin", "undefined"]
    assert sanitise("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert sanitise("Quadro RTX 6000/8000 (rev a1)") == "Quadro-RTX-60008000-rev-a1"


def test_features_file_written_atomically_only_on_change(make_node):
    host, _ = make_node("t4x2")
    labels = node_labels(read_inventory(host))
    assert write_labels(host, labels)
    path = host.host(FEATURES_FILE)
    assert path.read_text() == render(labels) and (path.stat().st_mode & 0o777) == 0o644
    mtime = path.stat().st_mtime_ns
    assert not write_labels(host, labels) and path.stat().st_mtime_ns == mtime


def test_cli(make_node):
    host, _ = make_node("t4x2")
    run = lambda *a: subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root),
                                     "labels", *a], capture_output=True, text=True)
    out = run("--no-timestamp")
    assert out.returncode == 0 and "nvidia.com/gpu.product=Tesla-T4\n" in out.stdout
    assert run("--sharing-strategy", "mps").returncode == 2
    assert run("--write").returncode == 0 and host.host(FEATURES_FILE).is_file()
