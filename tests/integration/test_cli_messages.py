"""Messages a new admin meets: errors in plain words with the file, line and column, dry
runs that promise only what the real run does, and the runtime sequence of
docs/runtime.md on a simulated node."""

import json
import os
import subprocess

import pytest

from hostagent.cli.main import main
from hostagent.errors import ConfigError, UsageError
from tests.rootneeds import GPU_CHANGES


def run(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def tree(root):
    """Every path under ``root`` but the node lock's folder, which any mutating command makes."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.relative_to(root).parts[:2] != ("run", "hostagent"))


# ---- YAML, JSON and TOML errors: file:line:column, one line ---------------------------

BAD_YAML = "a:\n  b: [1, 2\n  c: 3\n"          # the flow sequence never closes
YAML_AT = "3:4: not valid {kind}: expected ',' or ']', but got ':' (while parsing a flow sequence at line 2, column 6)"


@pytest.mark.parametrize("argv, kind", [
    (["runtime", "install-shim", "--dry-run", "--agent-config", "{f}"], "YAML or JSON"),  # hostagent's config
    (["mig", "plan", "-f", "{f}"], "YAML or JSON"),                                    # mig-parted config
    (["mig", "apply", "-c", "x", "-k", "{f}"], "YAML or JSON"),                        # mig-parted hooks
])
def test_a_yaml_error_names_the_file_line_and_column(make_node, tmp_path, capsys, argv, kind):
    host, _ = make_node("a30x4")
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_YAML)
    code, out, err = run(["--simulate", host.root, *(a.format(f=bad) for a in argv)], capsys)
    assert code == 1 and out == ""
    assert err == f"hostagent: error: {bad}:{YAML_AT.format(kind=kind)}\n"
    assert "<byte string>" not in err and "<unicode string>" not in err


def test_cdi_validate_and_engine_files_name_line_and_column(make_node, tmp_path, capsys):
    host, _ = make_node("t4x2")
    spec = tmp_path / "spec.json"
    spec.write_text('{"cdiVersion": "0.5.0",\n "kind" "nvidia.com/gpu"}\n')
    yml = tmp_path / "spec.yaml"
    yml.write_text(BAD_YAML)
    code, out, _ = run(["cdi", "validate", spec, yml], capsys)
    assert code == 1 and out.splitlines() == [f"{spec}:2:9: not valid JSON: Expecting ':' delimiter",
                                             f"{yml}:{YAML_AT.format(kind='YAML')}"]
    for d in ("etc/docker", "etc/containerd"):
        (host.root / d).mkdir(parents=True)
    (host.root / "etc/docker/daemon.json").write_text('{\n  "runtimes": {,\n}\n')
    (host.root / "etc/containerd/config.toml").write_text("version = 2\n[plugins\n")
    code, _, err = run(["--simulate", host.root, "runtime", "configure", "--runtime", "docker"], capsys)
    assert code == 1 and err.splitlines()[-1] == (
        "hostagent: error: /etc/docker/daemon.json:2:16: not valid JSON: Expecting property name enclosed "
        "in double quotes (fix the file by hand; nothing was changed)")
    code, _, err = run(["--simulate", host.root, "runtime", "configure", "--runtime", "containerd"], capsys)
    assert code == 1 and "hostagent: error: /etc/containerd/config.toml:2:9: not valid TOML:" in err


def test_config_and_api_keys_get_did_you_mean(tmp_path):
    from hostagent.api.schema import validate_body
    from hostagent.config import load_config
    path = tmp_path / "config.yaml"
    path.write_text("runtime:\n  low_level_runtime: [crun]\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "runtime: unknown key 'low_level_runtime' (did you mean 'low_level_runtimes'?)" in e.value.message
    with pytest.raises(UsageError) as e:
        validate_body("createAllocation", {"id": "a", "devices": [{"devic": "1"}]})
    assert e.value.message == "body.devices[0]: unknown key 'devic' (did you mean 'device'?)"
    with pytest.raises(UsageError) as e:
        validate_body("createAllocation", {"id": "a", "devices": [{"device": 1}]})
    assert e.value.message == "body.devices[0].device: must be of type string, not an integer"


# ---- dry runs and the runtime sequence -------------------------------------------------

def test_a_dry_run_fails_where_the_real_run_fails(make_node, capsys):
    host, _ = make_node("t4x2")                    # no /etc/containerd, no /usr/local/sbin
    before = tree(host.root)
    results = {}
    for dry in ([], ["--dry-run"]):
        results[bool(dry)] = run(["--simulate", host.root, "runtime", "configure", "--runtime", "containerd",
                                  *dry], capsys)
    assert results[True][0] == results[False][0] == 1
    assert results[True][2].splitlines()[-1] == results[False][2].splitlines()[-1] == (
        f"hostagent: error: {host.root}/etc/containerd: the directory does not exist "
        "(is the engine installed? nothing was changed)")
    for dry in ([], ["--dry-run"]):
        code, _, err = run(["--simulate", host.root, "runtime", "install-shim", *dry], capsys)
        assert code == 1 and err == (
            f"hostagent: error: {host.root}/usr/local/sbin: the directory for the shim "
            f"(/usr/local/sbin/hostagent-runtime) does not exist (create it (mkdir -p {host.root}/usr/local/sbin), "
            "or give --path a folder that exists and the same path to 'runtime configure --shim')\n")
    assert tree(host.root) == before


@pytest.mark.skipif(not any(os.access(os.path.join(d, r), os.X_OK) for d in os.environ["PATH"].split(":")
                            for r in ("runc", "crun")), reason="install-shim needs runc or crun (.ci/run installs runc)")
def test_docs_runtime_sequence_runs_on_a_simulated_node_with_engines(tmp_path, capsys):
    root = tmp_path / "node"
    code, out, _ = run(["sim", "create", "--profile", "t4x2", "--root", root, "--engines", "containerd"], capsys)
    assert code == 0 and "engines: containerd" in out
    sim = ["--simulate", root]
    assert run([*sim, "cdi", "refresh"], capsys)[0] == 0
    assert run([*sim, "runtime", "install-shim"], capsys)[0] == 0
    code, out, _ = run([*sim, "runtime", "configure", "--runtime", "containerd", "--dry-run"], capsys)
    assert code == 0 and "+++ /etc/containerd/conf.d/99-hostagent.toml" in out
    assert not (root / "etc/containerd/conf.d").exists()
    code, out, _ = run([*sim, "runtime", "configure", "--runtime", "containerd", "--restart"], capsys)
    assert code == 0 and "simulated node: no containerd to restart" in out
    assert 'BinaryName = "/usr/local/sbin/hostagent-runtime"' in (
        root / "etc/containerd/conf.d/99-hostagent.toml").read_text()


def test_cdi_list_says_where_it_looked(make_node, capsys):
    host, _ = make_node("t4x2")
    code, out, err = run(["--simulate", host.root, "cdi", "list"], capsys)
    assert code == 0 and out == ""
    assert err == (f"hostagent: note: no CDI devices in {host.root}/etc/cdi or {host.root}/var/run/cdi "
                   "(searched in that order); 'hostagent cdi refresh' writes this node's spec\n")
    code, out, _ = run(["--simulate", host.root, "cdi", "list", "-o", "json"], capsys)
    assert json.loads(out)["searched"] == [f"{host.root}/etc/cdi", f"{host.root}/var/run/cdi"]


@GPU_CHANGES
def test_mig_status_says_current_and_pending_mode(make_node, capsys):
    host, _ = make_node("a30x4")
    # A process holds GPU 0, so Ampere keeps the new mode pending (nvidia-smi says so).
    assert run(["--simulate", host.root, "sim", "hold", "0"], capsys)[0] == 0
    subprocess.run([str(host.root / "usr/bin/nvidia-smi"), "-i", "0", "-mig", "1"], capture_output=True, check=True,
                   env={**os.environ, "HOSTAGENT_SIMULATE": str(host.root)})
    code, out, _ = run(["--simulate", host.root, "mig", "status", "-o", "json"], capsys)
    modes = [g["mig"]["mode"] for g in json.loads(out)["gpus"]]
    assert code == 0 and modes[0] == {"current": "disabled", "pending": "enabled"}
    assert modes[1] == {"current": "disabled", "pending": "disabled"}
    assert "disabled (pending enabled)" in run(["--simulate", host.root, "mig", "status"], capsys)[1]
    assert run(["--simulate", host.root, "sim", "release"], capsys)[0] == 0


# ---- programs that are not the CLI --------------------------------------------------

def test_the_hook_program_explains_how_it_is_run():
    from tests.programs import script
    done = subprocess.run([script("hostagent-hook"), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert "python3 -I -S -c" in done.stdout and "createContainer" in done.stdout
    assert "python3 -I -m hostagent.hooks" in done.stdout
    refused = subprocess.run([script("hostagent-hook"), "prepare"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "not started isolated" in refused.stderr


def test_the_shim_front_says_what_it_is_before_the_runtime_answers(tmp_path, capsys):
    runtime = tmp_path / "runc"
    runtime.write_text('#!/bin/sh\necho "runc version 9.9"\necho "args: $*"\n')
    runtime.chmod(0o755)
    front = tmp_path / "hostagent-runtime"
    code, _, err = run(["runtime", "install-shim", "--path", front, "--low-level-runtime", runtime,
                        "--cache-dir", tmp_path, "--agent-config", tmp_path / "none.yaml"], capsys)
    assert code == 0, err
    for flag in ("--version", "--help"):
        done = subprocess.run([str(front), flag], capture_output=True, text=True, timeout=60)
        lines = done.stdout.splitlines()
        assert done.returncode == 0 and lines[0].startswith("hostagent-runtime ") and lines[-1] == f"args: {flag}"
    assert "runc version 9.9" in subprocess.run([str(front), "--version"], capture_output=True, text=True).stdout
    state = subprocess.run([str(front), "state", "x"], capture_output=True, text=True)     # no Python here
    assert state.stdout.splitlines() == ["runc version 9.9", "args: state x"]
