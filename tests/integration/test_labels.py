"""GFD-compatible labels from simulated nodes."""

import os
import re
import socket
import subprocess
import sys

import pytest

from hostagent.devices import read_inventory
from hostagent.labels import (FEATURES_FILE, TIMESTAMP, Sharing, node_labels, read_labels, render,
                              write_labels)
from hostagent.labels.gfd import gpu_family, sanitise
from hostagent.labels.hostfacts import gpu_mode, machine_type
from hostagent.sim.node import MIG_DISABLE, MIG_ENABLE

P = "nvidia.com/"


def layout(store, gpus, profiles, split=False):
    """Enable MIG on ``gpus`` and create one GI per profile id in ``profiles``, each with one
    full compute instance, or (``split``) as many of the smallest compute-instance profile
    as fit."""
    with store.mutate() as s:
        for g in gpus:
            s.set_mig_mode(store.facts, g, MIG_ENABLE)
            s.reset_gpu(g)
            for pid in profiles:
                gi = s.create_gi(store.facts, g, pid)
                cis = store.facts.skus[s.gpus[g].sku].mig.by_id(pid).ci_profiles
                ci = (min if split else max)(cis, key=lambda c: c.slices)
                for _ in range(ci.instances if split else 1):
                    s.create_ci(store.facts, g, gi.id, ci.id)


# Kubernetes label syntax (the API server rejects anything else): an optional DNS-subdomain
# prefix, a name of at most 63 characters; values empty or like names.
_NAME = r"(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_PREFIX = r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


def assert_kubernetes_labels(labels):
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        assert re.fullmatch(_NAME, name) and (not prefix or re.fullmatch(_PREFIX, prefix)), key
        assert value == "" or re.fullmatch(_NAME, value), (key, value)


@pytest.mark.parametrize("profile", ["dgx-a100", "hgx-h100", "hgx-h200", "a30x4", "mixed", "t4x2"])
def test_every_label_is_valid_for_kubernetes(make_node, profile):
    """Every simulated node, whole and with every MIG profile of its GPUs (full and split
    compute instances), under every strategy, shared or not."""
    host, store = make_node(profile)
    cases = [None]
    gpu0 = read_inventory(host).gpus[0]
    if gpu0.mig_capable:
        cases += [(p.id, split) for p in store.facts.skus[store.read().gpus[0].sku].mig.gi_profiles
                  for split in (False, True)]
    seen = set()
    for case in cases:
        if case is not None:
            pid, split = case
            layout(store, [0], [pid], split)
        inv = read_inventory(host)
        seen |= {d.profile for d in inv.mig_devices}
        for strategy in ("none", "single", "mixed"):
            for sharing in (Sharing(), Sharing("time-slicing", 4)):
                labels = node_labels(inv, mig_strategy=strategy, sharing=sharing,
                                     machine=machine_type(host), timestamp=1700000000)
                assert_kubernetes_labels(labels)
    if gpu0.mig_capable:
        assert {p.name for p in gpu0.mig.profiles} <= seen and any("+" in p for p in seen)


def test_me_profiles_are_named_as_gfd_names_them(make_node):
    host, store = make_node("dgx-a100")
    layout(store, [0], [20])                                 # 1g.5gb+me
    inv = read_inventory(host)
    assert [d.profile for d in inv.mig_devices] == ["1g.5gb+me"]
    mixed = node_labels(inv, mig_strategy="mixed")
    assert mixed[P + "mig-1g.5gb.me.count"] == "1"
    assert mixed[P + "mig-1g.5gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    assert not any("+" in k + v for k, v in mixed.items())
    layout(store, range(1, 8), [20])
    single = node_labels(read_inventory(host), mig_strategy="single")
    assert single[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me" and single[P + "gpu.count"] == "8"


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
    assert not any(k.startswith(P + "vgpu.") for k in labels)   # GFD: only on nodes with vGPUs
    assert_kubernetes_labels(labels)


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
    assert write_labels(host, labels) == (True, labels)
    path = host.host(FEATURES_FILE)
    assert path.read_text() == render(labels) and (path.stat().st_mode & 0o777) == 0o644
    mtime = path.stat().st_mtime_ns
    assert write_labels(host, labels) == (False, labels) and path.stat().st_mtime_ns == mtime
    # with gfd.timestamp: set when the labels change, not rewritten for a new time alone
    stamped = dict(labels, **{TIMESTAMP: "1700000000"})
    assert write_labels(host, labels, timestamp=1700000000) == (True, stamped)
    mtime = path.stat().st_mtime_ns
    assert write_labels(host, labels, timestamp=1800000000) == (False, stamped)
    assert path.stat().st_mtime_ns == mtime and read_labels(host) == stamped
    changed = dict(labels, **{P + "gpu.count": "3"})
    assert write_labels(host, changed, timestamp=1800000000) == (True, dict(changed, **{TIMESTAMP: "1800000000"}))
    assert write_labels(host, changed) == (True, changed)         # timestamp turned off: rewritten


def test_cli(make_node):
    host, _ = make_node("t4x2")
    run = lambda *a: subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root),
                                     "labels", *a], capture_output=True, text=True)
    out = run("--no-timestamp")
    assert out.returncode == 0 and "nvidia.com/gpu.product=Tesla-T4\n" in out.stdout
    assert TIMESTAMP not in out.stdout and re.search(r"^nvidia.com/gfd.timestamp=\d{10}$", run().stdout, re.M)
    assert run("--sharing-strategy", "mps").returncode == 2
    out = run("--sharing-strategy", "time-slicing", "--replicas", "4", "-o", "json")
    assert out.returncode == 0 and '"nvidia.com/gpu.product": "Tesla-T4-SHARED"' in out.stdout
    assert run("--write").returncode == 0
    assert re.fullmatch(r"\d{10}", read_labels(host)[TIMESTAMP])


def test_cli_with_a_stale_daemon_socket(make_node, monkeypatch):
    """The socket file of a daemon that is gone: labels are computed and written here, with
    no note about the daemon's labels."""
    host, _ = make_node("t4x2")
    run_dir = host.host("/run/hostagent")
    os.makedirs(run_dir, exist_ok=True)
    monkeypatch.chdir(run_dir)                 # a relative bind: the full path may be too long
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind("hostagent.sock")
    assert os.path.exists(host.host("/run/hostagent/hostagent.sock"))
    run = lambda *a: subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root),
                                     "labels", *a], capture_output=True, text=True)
    for args in [(), ("--mig-strategy", "mixed")]:
        out = run(*args)
        assert out.returncode == 0 and out.stderr == "", (args, out.stderr)
        assert "nvidia.com/gpu.product=Tesla-T4\n" in out.stdout
    out = run("--write")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert read_labels(host)[P + "gpu.product"] == "Tesla-T4"


def gpu_labels(labels):
    keys = ("product", "count", "replicas", "sharing-strategy", "memory", "family", "compute.major")
    return tuple(labels.get(f"{P}gpu.{k}") for k in keys)


A100 = "NVIDIA-A100-SXM4-40GB"


@pytest.mark.parametrize("strategy", ["none", "mixed"])
def test_mig_enabled_gpus_are_labelled_without_sharing_and_counted_by_model(make_node, strategy):
    """GFD labels MIG-enabled GPUs with replicas 0, no -SHARED, sharing none; a model's
    count is every GPU of it, MIG-enabled or not; full GPUs of the model carry the sharing."""
    host, store = make_node("dgx-a100")
    layout(store, range(8), [9])
    shared = Sharing("time-slicing", 4)
    all_mig = node_labels(read_inventory(host), mig_strategy=strategy, sharing=shared)
    assert gpu_labels(all_mig) == (A100, "8", "0", "none", "40960", "ampere", "8")
    assert all_mig[P + "mps.capable"] == "false"
    assert gpu_labels(node_labels(read_inventory(host), mig_strategy=strategy)) == \
        (A100, "8", "0", "none", "40960", "ampere", "8")
    with store.mutate() as s:                    # GPUs 4-7 whole again
        for g in range(4, 8):
            s.gpus[g].gis.clear()
            s.set_mig_mode(store.facts, g, MIG_DISABLE)
            s.reset_gpu(g)
    half = node_labels(read_inventory(host), mig_strategy=strategy, sharing=shared)
    assert gpu_labels(half) == (A100 + "-SHARED", "8", "4", "time-slicing", "40960", "ampere", "8")
    if strategy == "mixed":                      # the MIG resources are replicated too
        assert half[P + "mig-3g.20gb.count"] == "4" and half[P + "mig-3g.20gb.replicas"] == "4"


def test_single_strategy_shares_the_mig_resource(make_node):
    host, store = make_node("dgx-a100")
    layout(store, range(8), [9, 9])
    labels = node_labels(read_inventory(host), mig_strategy="single", sharing=Sharing("time-slicing", 4))
    assert gpu_labels(labels) == (A100 + "-MIG-3g.20gb-SHARED", "16", "4", "time-slicing", "19968", "ampere", "8")


def test_several_models_are_never_counted_together(make_node):
    """The mixed node: 2x A100-SXM4-80GB (GPUs 0, 1) and a T4 (GPU 2). GFD labels one model
    with its own count (which one wins is random in GFD; here the lowest-indexed model of
    the GPUs not MIG-enabled, else of the MIG-enabled ones)."""
    host, store = make_node("mixed")
    a100 = "NVIDIA-A100-SXM4-80GB"
    whole = node_labels(read_inventory(host))
    assert gpu_labels(whole) == (a100, "2", "1", "none", "81920", "ampere", "8")
    layout(store, [0, 1], [9, 9])                # the A100s MIG-enabled: the T4 is the full GPU
    inv = read_inventory(host)
    for strategy in ("none", "mixed"):
        labels = node_labels(inv, mig_strategy=strategy, sharing=Sharing("time-slicing", 2))
        assert gpu_labels(labels) == ("Tesla-T4-SHARED", "1", "2", "time-slicing", "15360", "turing", "7")
        assert labels[P + "gpu.compute.minor"] == "5"
    invalid = node_labels(inv, mig_strategy="single")   # MIG and full GPUs: invalid, T4's architecture
    assert gpu_labels(invalid) == (a100 + "-MIG-INVALID", "0", "0", "", "0", "turing", "7")
    assert invalid[P + "gpu.compute.minor"] == "5"


def test_the_mig_strategy_a_flag_the_config_then_the_sharing_file(make_node, capsys):
    """GFD and the device plugin take flags.migStrategy from their config file unless a flag
    says otherwise: a command-line flag, then the labels section, then the sharing file."""
    from hostagent.cli.main import main
    from hostagent.daemon.nodelabels import mig_strategy
    from hostagent.sharing.config import config_path, parse, render
    host, store = make_node("a30x4")
    layout(store, [0], [14])                         # one MIG-enabled GPU: every strategy labels it

    def labelled(*args):
        assert main(["--simulate", str(host.root), "labels", "--no-timestamp", *args]) == 0
        return dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines()).get(P + "mig.strategy")

    assert mig_strategy(host, None) == "none" and labelled() is None
    path = config_path(host)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(parse({"version": "v1", "flags": {"migStrategy": "mixed"},
                                  "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}})))
    assert mig_strategy(host, None) == "mixed" and labelled() == "mixed"
    assert mig_strategy(host, "single") == "single" and labelled("--mig-strategy", "single") == "single"
    host.config_file.parent.mkdir(parents=True, exist_ok=True)
    host.config_file.write_text("labels:\n  mig_strategy: single\n")
    assert labelled() == "single" and labelled("--mig-strategy", "mixed") == "mixed"
