"""``hostagent mig`` as users run it: verbs, exit codes, one-line errors, hooks, the lock."""

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml

from hostagent.cli.main import main
from hostagent.devices import read_inventory
from hostagent.lock import node_lock
from hostagent.mig.layout import Layout
from tests.rootneeds import GPU_CHANGES

CONFIG = """version: v1
mig-configs:
  mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"1c.7g.80gb": 2, "2c.7g.80gb": 1}
  off:
    - devices: all
      mig-enabled: false
  wrong-sku:
    - devices: all
      mig-enabled: true
      mig-devices: {"2g.10gb": 1}
"""


@pytest.fixture
def node(make_node, tmp_path):
    host, store = make_node("mixed")             # 2x A100-80GB + T4
    cfg = tmp_path / "mig.yaml"
    cfg.write_text(CONFIG)
    return host, store, cfg


def run(capsys, host, *args):
    try:
        code = main(["--simulate", str(host.root), "mig", *map(str, args)])
    except SystemExit as e:                      # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def layouts(host):
    return {g.index: Layout.of(g) for g in read_inventory(host).gpus if g.mig}


@GPU_CHANGES
def test_apply_assert_plan_status_export(capsys, node, persistenced):
    host, store, cfg = node
    persistenced(store)      # a driver client: the Ampere mode changes wait for the planned reset
    code, out, err = run(capsys, host, "assert", "-f", cfg, "-c", "mixed")
    assert code == 1 and err.strip() == ("hostagent: error: assertion failure: selected configuration not "
                                         "currently applied (GPU 0, 1 differ; 'hostagent mig plan' shows "
                                         "what applying would change)")
    code, out, err = run(capsys, host, "plan", "-f", cfg, "-c", "mixed")
    assert code == 0 and "GPU 0 (NVIDIA A100-SXM4-80GB, 00000000:41:00.0): enable MIG (reset if left pending)" in out
    assert "create GPU instance 3g.40gb@4:4" in out and "reset the GPU if the driver leaves the new mode pending (nvidia-smi -r -i 00000000:41:00.0)" in out
    code, out, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed")
    assert code == 0, err
    assert "GPU 0: enable MIG mode" in err and "resetting GPU 0" in err      # progress on stderr
    assert "GPU 1 (NVIDIA A100-SXM4-80GB): enable MIG (reset if left pending), create 1 GI, create 3 CI" in out
    assert out.strip().endswith("applied successfully: 2 GPU(s) changed, 0 unchanged")
    assert run(capsys, host, "assert", "-f", cfg, "-c", "mixed")[0] == 0
    code, out, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed")
    assert code == 0 and "already in place, nothing changed" in out and err == ""
    code, out, _ = run(capsys, host, "status", "-o", "json")
    status = json.loads(out)
    assert status["gpus"][1]["mig"]["devices"] == {"1c.7g.80gb": 2, "2c.7g.80gb": 1}
    assert status["gpus"][2]["mig"] is None and status["checkpoint"]["config"] == "mixed"
    code, out, _ = run(capsys, host, "status")
    assert "2x 1g.10gb, 1x 2g.20gb, 1x 3g.40gb" in out and "7g.80gb@0:8" in out
    code, out, _ = run(capsys, host, "export", "-l", "saved")
    exported = yaml.safe_load(out)
    assert exported["version"] == "v1" and list(exported["mig-configs"]) == ["saved"]
    assert {"device-filter": "0x1EB810DE", "devices": "all", "mig-enabled": False} in exported["mig-configs"]["saved"]


def test_export_round_trips_onto_another_node(capsys, node, make_node, tmp_path):
    host, _, cfg = node
    run(capsys, host, "apply", "-f", cfg, "-c", "mixed")
    code, out, _ = run(capsys, host, "export", "-o", "json")
    saved = tmp_path / "exported.json"
    saved.write_text(out)
    assert run(capsys, host, "assert", "-f", saved, "-c", "current")[0] == 0
    other, _ = make_node("mixed")
    assert run(capsys, other, "apply", "-f", saved)[0] == 0     # the only config: -c optional
    assert {i: l.counts() for i, l in layouts(other).items()} == {i: l.counts() for i, l in layouts(host).items()}


def test_dry_run_changes_nothing(capsys, node):
    host, store, cfg = node
    before = store.state_file.read_text()
    code, out, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--dry-run", "-o", "json")
    assert code == 0 and "dry run" in err
    assert json.loads(out)["changed"] == [0, 1]
    assert store.state_file.read_text() == before


def test_errors_are_one_line_with_exit_codes(capsys, node, tmp_path):
    host, _, cfg = node
    # A profile these GPUs do not have is an unknown name: a usage error, as the README says.
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "wrong-sku")
    assert code == 2 and err.count("\n") == 1
    assert "GPU 0, 1 (NVIDIA A100-SXM4-80GB): no MIG profile '2g.10gb'; the profiles are " in err
    assert err.count("no MIG profile") == 1 and "nothing was changed" in err
    # A config that does not fit the GPUs is a failure.
    toomany = tmp_path / "toomany.yaml"
    toomany.write_text("version: v1\nmig-configs:\n  x:\n    - devices: [0]\n      mig-enabled: true\n"
                       "      mig-devices: {\"1g.10gb\": 8}\n")
    code, _, err = run(capsys, host, "apply", "-f", toomany, "-c", "x")
    assert code == 1 and "8x 1g.10gb need more than the 7 1g.10gb GPU instances the GPU allows" in err
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "nope")
    assert code == 2 and "no MIG config named 'nope'" in err and "mixed, off, wrong-sku" in err
    code, _, err = run(capsys, host, "apply", "-f", cfg)
    # mig-parted's words and exit status 1
    assert code == 1 and "missing required flag 'selected-config' when more than one config available" in err
    assert "choose one with -c: mixed, off, wrong-sku" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs:\n  x:\n    - devices: 7\n      mig-enabled: false\n")
    code, _, err = run(capsys, host, "plan", "-f", bad, "-c", "x")
    assert code == 1 and f"{bad}: mig-configs.x[0]: 'devices' must be \"all\" or a list of GPU indices" in err
    assert err.count("\n") == 1 and "(mig-parted: json: cannot unmarshal number" in err
    code, _, err = run(capsys, host, "apply", "-f", tmp_path / "missing.yaml", "-c", "x")
    assert code == 1 and "MIG config file not found" in err
    code, _, err = run(capsys, host, "apply", "--bogus")
    assert code == 2
    code, _, err = run(capsys, host, "apply", "-c", "all-enabled", "--skip-reset")
    assert code == 2 and "--skip-reset" in err


@GPU_CHANGES
def test_bundled_default_is_used_without_a_file_and_can_be_printed(capsys, node):
    host, _, _ = node
    code, out, _ = run(capsys, host, "export", "--bundled")
    bundled = yaml.safe_load(out)["mig-configs"]
    assert bundled["all-balanced"] == [{"device-filter": "0x20B210DE", "devices": "all", "mig-enabled": True,
                                        "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}]
    assert run(capsys, host, "apply", "-c", "all-balanced")[0] == 0
    assert run(capsys, host, "assert", "-c", "all-balanced")[0] == 0


@GPU_CHANGES
def test_mig_parted_environment_variables_select_file_and_config(node):
    host, _, cfg = node
    env = {**os.environ, "MIG_PARTED_CONFIG_FILE": str(cfg), "MIG_PARTED_SELECTED_CONFIG": "mixed"}
    env.pop("HOSTAGENT_SIMULATE", None)
    done = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root),
                           "mig", "apply"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert layouts(host)[1].counts() == {"1c.7g.80gb": 2, "2c.7g.80gb": 1}


def hooks_file(tmp_path, names, fail=None):
    log = tmp_path / "hooks.log"
    hooks = {}
    for name in names:
        script = f'echo "{name} $MIG_PARTED_SELECTED_CONFIG $HOOK_VAR ${{PARENT_VAR:-unset}}" >> {log}'
        if name == fail:
            script += "; echo 'cannot stop kubelet' >&2; exit 3"
        hooks[name] = [{"command": "/bin/sh", "args": ["-c", script], "envs": {"HOOK_VAR": "from-hook"}}]
    path = tmp_path / "hooks.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", "hooks": hooks}))
    return path, log


ALL_HOOKS = ["apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"]


@GPU_CHANGES
def test_hooks_run_at_mig_parteds_points_with_its_environment(capsys, node, tmp_path, monkeypatch):
    host, _, cfg = node
    monkeypatch.setenv("PARENT_VAR", "leaked")       # hooks do not inherit the caller's environment
    path, log = hooks_file(tmp_path, ALL_HOOKS)
    assert run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--hooks", path)[0] == 0
    assert log.read_text().splitlines() == [f"{n} mixed from-hook unset" for n in ALL_HOOKS]
    log.unlink()
    assert run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "-k", path)[0] == 0
    # Already applied: the pre-apply hooks (which stop services) do not run.
    assert log.read_text().splitlines() == ["apply-start mixed from-hook unset", "apply-exit mixed from-hook unset"]


@GPU_CHANGES
def test_a_failing_hook_before_config_rolls_back_the_mode_change(capsys, node, tmp_path):
    host, _, cfg = node
    before = layouts(host)
    path, log = hooks_file(tmp_path, ALL_HOOKS, fail="pre-apply-config")
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--hooks", path)
    assert code == 1 and "pre-apply-config hook failed: /bin/sh exited with status 3: cannot stop kubelet" in err
    assert "rolled back to the previous layout" in err
    assert layouts(host) == before
    assert [ln.split()[0] for ln in log.read_text().splitlines()] == ALL_HOOKS    # apply-exit still ran


def test_a_failing_apply_start_hook_stops_before_anything(capsys, node, tmp_path):
    host, store, cfg = node
    before = store.state_file.read_text()
    path, log = hooks_file(tmp_path, ALL_HOOKS, fail="apply-start")
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--hooks", path)
    assert code == 1 and "apply-start hook failed" in err
    assert store.state_file.read_text() == before
    assert [ln.split()[0] for ln in log.read_text().splitlines()] == ["apply-start"]


def test_unknown_hook_names_are_rejected(capsys, node, tmp_path):
    host, _, cfg = node
    path = tmp_path / "hooks.yaml"
    path.write_text("version: v1\nhooks:\n  pre-apply-modes:\n    - command: /bin/true\n")
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--hooks", path)
    assert code == 1 and "unknown hook 'pre-apply-modes'" in err


@GPU_CHANGES
def test_concurrent_applies_wait_for_the_node_lock(node):
    host, _, cfg = node
    cli = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), "mig", "apply",
           "-f", str(cfg), "-c", "mixed"]
    with node_lock(host, "test holds the node"):
        proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # It says whom it waits for, then waits (no timeout by default: resets take minutes).
        assert proc.stderr.readline() == f"hostagent: waiting for the node lock, held by pid {os.getpid()}: " \
                                         "test holds the node\n"
        assert proc.poll() is None
        assert not any(l.enabled for l in layouts(host).values())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert layouts(host)[0].counts() == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


def test_lock_timeout_bounds_the_wait(capsys, node):
    host, store, cfg = node
    before = store.state_file.read_text()
    held, done = threading.Event(), threading.Event()

    def holder():                 # another thread: the lock is re-entrant within one
        with node_lock(host, "test holds the node"):
            held.set()
            done.wait(30)
    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    try:
        code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--lock-timeout", "0.2")
    finally:
        done.set()
        t.join()
    assert code == 1 and err.splitlines()[-1] == (
        f"hostagent: error: {host.run_dir}/node.lock: the node is locked by pid {os.getpid()}: test holds "
        "the node (waited 0.2 s) (wait for it to finish, then retry (mig apply mixed))")
    assert store.state_file.read_text() == before
    assert run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--lock-timeout", "soon")[0] == 2


def test_read_commands_do_not_wait_for_a_running_apply(capsys, node):
    host, _, cfg = node
    import hostagent.mig.service as service
    run(capsys, host, "apply", "-f", cfg, "-c", "mixed")
    # An apply in progress in another process: journal present, lock held.
    from hostagent.mig.journal import Journal
    Journal.path(host).write_text("{}")
    code = ("import sys, time; from hostagent.lock import node_lock; from hostagent.sim.platform import simulated_host\n"
            "with node_lock(simulated_host(sys.argv[1]), 'mig apply'):\n"
            "    print('locked', flush=True); time.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(host.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        note = service.recover_pending(host, wait=0.2)
        assert note.startswith("a MIG apply is in progress (the node is locked by pid")
    finally:
        holder.kill()
        holder.wait()
        Journal.path(host).unlink()


def sigterm_in_pre_apply_config(host, cfg, tmp_path, env=None):
    """What systemd does when the boot unit exceeds TimeoutStartSec, after the mode phase."""
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(yaml.safe_dump({"version": "v1", "hooks": {
        "pre-apply-config": [{"command": "/bin/sh", "args": ["-c", "kill -TERM $PPID; sleep 1"]}]}}))
    return subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), "mig",
                           "apply", "-f", str(cfg), "-c", "mixed", "--hooks", str(hooks)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


@GPU_CHANGES
def test_sigterm_mid_apply_rolls_back_and_says_so(node, tmp_path):
    host, _, cfg = node
    before = layouts(host)
    done = sigterm_in_pre_apply_config(host, cfg, tmp_path)
    assert done.returncode == 130 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == ("hostagent: error: applying 'mixed' was interrupted after 2 of 14 "
                                            "steps; rolled back to the previous layout (2 steps)")
    assert layouts(host) == before          # the mode change of the first phase was undone
    from hostagent.mig.journal import Journal
    assert Journal.load(host) is None


@GPU_CHANGES
def test_sigterm_with_a_failing_rollback_says_the_journal_is_kept(node, tmp_path):
    host, _, cfg = node
    from hostagent.sim.fakenvml import FAULT_ENV
    # Two mode changes (GPU 0 and 1) pass; the rollback's first NVML call fails.
    done = sigterm_in_pre_apply_config(host, cfg, tmp_path, {FAULT_ENV: "error:2"})
    assert done.returncode == 130 and "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("hostagent: error: applying 'mixed' was interrupted after 2 of 14 steps; "
                           "rolling back failed too (GPU ")
    assert last.endswith("the next 'hostagent mig' command retries the rollback")
    code = run_cli(host, "status")
    assert code.returncode == 0 and "rolled back the interrupted apply of 'mixed'" in code.stderr
    assert not any(l.enabled or l.pending for l in layouts(host).values())


def run_cli(host, *args):
    return subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), "mig",
                           *args], capture_output=True, text=True)


@GPU_CHANGES
def test_apply_refreshes_the_cdi_spec(capsys, node):
    host, _, cfg = node
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed")
    assert code == 0, err
    assert "CDI spec:" in err
    spec = json.loads(host.cdi_dir.joinpath("nvidia.com-gpu.json").read_text())
    names = {d["name"] for d in spec["devices"]}
    migs = {d.name for g in read_inventory(host).gpus if g.mig for d in g.mig.devices}
    assert len(migs) == 7 and migs <= names and "0" not in names and "2" in names
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "off")
    spec = json.loads(host.cdi_dir.joinpath("nvidia.com-gpu.json").read_text())
    assert code == 0 and {"0", "1", "2"} <= {d["name"] for d in spec["devices"]}


@GPU_CHANGES
def test_assert_fails_when_a_selected_gpu_cannot_be_read(capsys, make_node):
    host, store = make_node("a30x4")
    assert run(capsys, host, "apply", "-c", "all-balanced")[0] == 0
    from hostagent.sim import control
    control.lose_gpu(store, 3)
    code, _, err = run(capsys, host, "assert", "-c", "all-balanced")
    assert code == 1 and err.count("\n") == 1
    assert "assertion failure: selected configuration not currently applied: GPU 3 cannot be read" in err
    code, out, err = run(capsys, host, "plan", "-c", "all-balanced")      # plan and apply leave it alone
    assert code == 0 and "warning: GPU 3 cannot be read" in out


@GPU_CHANGES
def test_without_the_daemon_allocated_devices_are_not_taken_away(capsys, node):
    """The daemon's allocations checkpoint protects its devices while the daemon is stopped."""
    from hostagent.daemon import checkpoint
    from hostagent.daemon.allocations import Allocation, normalize
    host, store, cfg = node
    assert run(capsys, host, "apply", "-f", cfg, "-c", "mixed")[0] == 0
    mig = next(d for d in read_inventory(host).gpus[1].mig.devices)
    request = normalize({"id": "claim-1", "devices": [{"device": mig.uuid}]})
    checkpoint.save(host, [Allocation("claim-1", (mig.uuid,), request, 1.0)])
    saved = checkpoint.path(host).read_text()
    before = store.state_file.read_text()
    for args in (["apply", "-c", "off"], ["apply", "-c", "off", "--dry-run"]):
        code, _, err = run(capsys, host, *args, "-f", cfg)
        assert code == 1 and err.count("\n") == 1
        assert f"the change would take away allocated device(s) {mig.uuid}" in err and "--force" in err
    assert store.state_file.read_text() == before
    code, out, err = run(capsys, host, "apply", "-f", cfg, "-c", "off", "--force")
    assert code == 0 and "the daemon drops allocations claim-1 at its next start" in err
    assert not any(l.enabled for l in layouts(host).values())
    assert checkpoint.path(host).read_text() == saved          # read, never written
    checkpoint.path(host).write_text("{broken")
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed")
    assert code == 1 and "the allocations checkpoint cannot be read" in err
    assert checkpoint.path(host).read_text() == "{broken"


def test_without_the_driver_the_boot_units_apply_succeeds_and_does_nothing(capsys, node):
    host, store, cfg = node
    from hostagent.sim import control
    control.set_driver_loaded(store, False)
    code, _, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed")
    assert code == 1 and "NVIDIA kernel driver is not loaded" in err       # interactive: strict
    code, out, err = run(capsys, host, "apply", "-f", cfg, "-c", "mixed", "--if-driver-loaded")
    assert code == 0 and out == ""
    assert err == ("hostagent: MIG layout not applied: NVML is installed but the NVIDIA kernel driver is "
                   "not loaded (--if-driver-loaded)\n")
    control.set_driver_loaded(store, True)
    assert not any(l.enabled for l in layouts(host).values())


def test_assert_valid_config_only_checks_the_file(capsys, node, tmp_path, monkeypatch):
    host, store, cfg = node
    code, out, _ = run(capsys, host, "assert", "-f", cfg, "-c", "wrong-sku", "-a")   # not applied, not applicable
    assert code == 0 and out == "MIG configuration 'wrong-sku' is valid\n"
    code, _, err = run(capsys, host, "assert", "-f", cfg, "-c", "nope", "--valid-config")
    assert code == 2 and "no MIG config named 'nope'" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs:\n  x:\n    - devices: all\n")
    assert run(capsys, host, "assert", "-f", bad, "-c", "x", "-a")[0] == 1
    monkeypatch.setenv("MIG_PARTED_VALID_CONFIG", "true")     # read when the parser is built
    assert run(capsys, host, "assert", "-f", cfg, "-c", "mixed")[0] == 0


@GPU_CHANGES
def test_defaults_then_overrides_as_mig_parted_applies_them(capsys, node, tmp_path):
    host, _, _ = node
    cfg = tmp_path / "override.yaml"
    cfg.write_text("version: v1\nmig-configs:\n  c:\n"
                   "    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n"
                   "    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"7g.80gb\": 1}\n"
                   "    - device-filter: \"0x1EB810DE\"\n      devices: all\n      mig-enabled: false\n")
    assert run(capsys, host, "apply", "-f", cfg, "-c", "c")[0] == 0
    assert {i: l.counts() for i, l in layouts(host).items()} == {0: {"1g.10gb": 7}, 1: {"7g.80gb": 1}}
    assert run(capsys, host, "assert", "-f", cfg, "-c", "c")[0] == 0
    cfg.write_text("version: v1\nmig-configs:\n  c:\n    - devices: [0, 3]\n      mig-enabled: false\n")
    code, _, err = run(capsys, host, "plan", "-f", cfg, "-c", "c")
    assert code == 1 and "entry 0 names GPU 3, but this node has GPU 0-2" in err
