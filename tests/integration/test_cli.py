"""The hostagent command line as users run it: real processes, real exit codes."""

import json
import os
import subprocess
import sys

import pytest
import yaml


def hostagent(*args, env=None, check=True):
    run_env = {k: v for k, v in os.environ.items() if k != "HOSTAGENT_SIMULATE"}
    run_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "hostagent.cli.main", *map(str, args)],
                          capture_output=True, text=True, env=run_env)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def node(make_node):
    host, store = make_node("mixed")
    return host.root


def test_version():
    from hostagent import __version__
    assert hostagent("--version").stdout.strip() == f"hostagent {__version__}"


def test_devices_json_and_yaml_agree(node):
    data = json.loads(hostagent("--simulate", node, "devices", "-o", "json").stdout)
    assert [g["name"] for g in data["gpus"]] == ["NVIDIA A100-SXM4-80GB"] * 2 + ["Tesla T4"]
    assert data["gpus"][2]["mig"] is None
    assert data["gpus"][0]["mig"]["profiles"] == []          # only with --profiles
    assert yaml.safe_load(hostagent("--simulate", node, "devices", "-o", "yaml").stdout) == data
    with_profiles = json.loads(hostagent("--simulate", node, "devices", "--profiles", "-o", "json").stdout)
    names = [p["name"] for p in with_profiles["gpus"][0]["mig"]["profiles"]]
    assert "3g.40gb" in names and "1g.10gb+me" in names


def test_devices_table_shows_mig_devices_and_profiles(node):
    env = {"HOSTAGENT_SIMULATE": str(node)}
    hostagent("sim", "reboot", env=env)           # nothing pending: a no-op for modes
    out = hostagent("devices", "--profiles", env=env).stdout
    assert "Tesla T4" in out and "not MIG capable" in out
    assert "3g.40gb" in out and "0,4 (size 4)" in out


def test_node_reports_versions_and_paths(node):
    data = yaml.safe_load(hostagent("--simulate", node, "node", "-o", "yaml").stdout)
    assert data["driver_version"] == "550.90.07" and data["cuda_driver_version"] == "12.4"
    assert data["paths"]["root"] == str(node) and data["simulated"] is True
    assert "driver version" in hostagent("--simulate", node, "node").stdout


def test_sim_profiles_lists_every_profile():
    out = hostagent("sim", "profiles").stdout
    for name in ("dgx-a100", "hgx-h100", "hgx-h200", "a30x4", "t4x2", "mixed"):
        assert name in out


def test_sim_create_refuses_to_overwrite_and_rejects_unknown_profiles(tmp_path):
    hostagent("sim", "create", "--profile", "t4x2", "--root", tmp_path)
    again = hostagent("sim", "create", "--profile", "t4x2", "--root", tmp_path, check=False)
    assert again.returncode == 2 and "--force" in again.stderr
    hostagent("sim", "create", "--profile", "t4x2", "--root", tmp_path, "--force")
    bad = hostagent("sim", "create", "--profile", "dgx-z9", "--root", tmp_path / "new", check=False)
    assert bad.returncode == 1 and "dgx-a100" in bad.stderr
    assert not (tmp_path / "new").exists()


def test_errors_are_one_line_with_exit_codes(node, tmp_path):
    missing = hostagent("--simulate", tmp_path, "devices", check=False)
    assert missing.returncode == 1 and "not a simulated node" in missing.stderr
    bad_gpu = hostagent("sim", "xid", "--gpu", "9", "--xid", "48", "--root", node, check=False)
    assert bad_gpu.returncode == 1 and "no GPU 9" in bad_gpu.stderr
    usage = hostagent("devices", "-o", "xml", check=False)
    assert usage.returncode == 2
    no_root = hostagent("sim", "reboot", check=False)
    assert no_root.returncode == 2 and "--root" in no_root.stderr


def test_sim_verbs_drive_the_node(node):
    from hostagent.sim.store import SimStore
    store = SimStore(node)
    out = hostagent("sim", "hold", "0", "--root", node, "--name", "trainer").stdout
    pid = int(out.split()[1])
    assert [p.pid for p in store.read().processes] == [pid]
    hostagent("sim", "release", pid, "--root", node)
    assert store.read().processes == []
    hostagent("sim", "xid", "--gpu", "1", "--xid", "48", "--root", node)
    hostagent("sim", "ecc", "--gpu", "1", "--root", node)
    assert [e.data for e in store.read().events] == [48, 0]
    hostagent("sim", "lose", "--gpu", "0", "--root", node)
    out = hostagent("--simulate", node, "devices").stdout
    assert "GPU 0: unreadable: GPU is lost" in out
    hostagent("sim", "driver", "unload", "--root", node)
    failed = hostagent("--simulate", node, "devices", check=False)
    assert failed.returncode == 1 and "kernel driver is not loaded" in failed.stderr


def test_demo_runs_on_a_temporary_node():
    out = hostagent("sim", "demo").stdout
    assert out.count("NVIDIA A100-SXM4-40GB") == 8 and "driver 550.90.07" in out
