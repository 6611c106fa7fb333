"""hostagent-runtime end to end on files: the sh front, the Python part, a fake runc."""

import json
import os
import subprocess
import sys

import pytest

from hostagent.cli.main import main

SPEC = {"cdiVersion": "0.5.0", "kind": "example.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "permissions": "rwm"}]}}],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                           "mounts": [{"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1",
                                       "options": ["ro", "nosuid", "nodev", "bind"]}],
                           "hooks": [{"hookName": "createContainer", "path": "/usr/bin/true"}]}}
FAKE_RUNC = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/called"
"""


@pytest.fixture
def shim(tmp_path):
    root = tmp_path / "root"
    (root / "usr/sbin").mkdir(parents=True)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "example.json").write_text(json.dumps(SPEC))
    runc = tmp_path / "bin/runc"
    runc.parent.mkdir()
    runc.write_text(FAKE_RUNC)
    runc.chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text(f"runtime:\n  cdi_spec_dirs: [{cdi}]\n  default_kind: example.com/gpu\n"
                      f"  log_file: {tmp_path / 'shim.log'}\n")
    assert main(["--simulate", str(root), "runtime", "install-shim", "--path", "/usr/sbin/hostagent-runtime",
                 "--low-level-runtime", str(runc), "--agent-config", str(config)]) == 0
    return root / "usr/sbin/hostagent-runtime", tmp_path


def bundle(tmp_path, **config):
    b = tmp_path / "bundle"
    b.mkdir(exist_ok=True)
    cfg = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}},
           "root": {"path": "rootfs"}, "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
           "linux": {}}
    cfg.update(config)
    (b / "config.json").write_text(json.dumps(cfg, indent=1))
    return b


def run(front, *args, cwd=None):
    return subprocess.run([str(front), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def called(tmp_path):
    path = tmp_path / "bin/called"
    return path.read_text().splitlines() if path.exists() else None


def test_front_is_sh_and_names_what_it_runs(shim):
    front, tmp_path = shim
    text = front.read_text()
    assert text.startswith("#!/bin/sh\n") and os.access(front, os.X_OK)
    assert str(tmp_path / "bin/runc") in text and sys.executable in text


def test_other_commands_go_straight_to_runc(shim):
    front, tmp_path = shim
    # Break the Python part: if the front started it, the call would fail.
    front.write_text(front.read_text().replace(sys.executable, "/nonexistent/python3"))
    args = ["--root", "/run/runc", "--log", "/tmp/x.json", "state", "container-1"]
    assert run(front, *args).returncode == 0
    assert called(tmp_path) == args


def test_create_without_request_leaves_config_untouched(shim):
    front, tmp_path = shim
    front.write_text(front.read_text().replace(sys.executable, "/nonexistent/python3"))
    b = bundle(tmp_path, annotations={"io.kubernetes.cri.container-type": "container"})
    before = (b / "config.json").read_bytes()
    args = ["--root", "/run/runc", "create", "--bundle", str(b), "--pid-file", "/tmp/pid", "c1"]
    proc = run(front, *args)
    assert proc.returncode == 0, proc.stderr
    assert called(tmp_path) == args
    assert (b / "config.json").read_bytes() == before


def test_create_with_annotation_applies_the_device(shim):
    front, tmp_path = shim
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    args = ["create", "--bundle", str(b), "c1"]
    proc = run(front, *args)
    assert proc.returncode == 0, proc.stderr
    assert called(tmp_path) == args
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["linux"]["devices"] == [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"} in cfg["linux"]["resources"]["devices"]
    assert [m["destination"] for m in cfg["mounts"]] == ["/proc", "/usr/lib/libcuda.so.1"]
    assert cfg["hooks"]["createContainer"] == [{"path": "/usr/bin/true"}]
    assert "NVIDIA_VISIBLE_DEVICES=void" in cfg["process"]["env"]
    assert "example.com/gpu=0" in (tmp_path / "shim.log").read_text()


@pytest.mark.parametrize("form", [["--bundle={b}"], ["-b", "{b}"], ["-bundle", "{b}"], ["-b={b}"]])
def test_bundle_flag_forms(shim, form):
    front, tmp_path = shim
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    assert run(front, "--root", "/run/x", "create", *[f.format(b=b) for f in form], "c1").returncode == 0
    assert json.loads((b / "config.json").read_text())["linux"]["devices"]


def test_relative_bundle_is_the_working_directory(shim):
    front, tmp_path = shim
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    assert run(front, "create", "c1", cwd=b).returncode == 0
    assert json.loads((b / "config.json").read_text())["linux"]["devices"]


def test_env_needs_privilege_by_default(shim):
    front, tmp_path = shim
    b = bundle(tmp_path, process={"env": ["NVIDIA_VISIBLE_DEVICES=0"]})
    before = (b / "config.json").read_bytes()
    assert run(front, "create", "--bundle", str(b), "c1").returncode == 0
    assert (b / "config.json").read_bytes() == before        # an image's baked-in variable: ignored
    b = bundle(tmp_path, process={"env": ["NVIDIA_VISIBLE_DEVICES=0"],
                                  "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}})
    assert run(front, "create", "--bundle", str(b), "c1").returncode == 0
    assert json.loads((b / "config.json").read_text())["linux"]["devices"][0]["path"] == "/dev/nvidia0"


def test_baked_in_env_of_an_unprivileged_image_costs_no_python(shim):
    """CUDA images set NVIDIA_VISIBLE_DEVICES=all; by default that alone must not start Python."""
    front, tmp_path = shim
    front.write_text(front.read_text().replace(sys.executable, "/nonexistent/python3"))
    b = bundle(tmp_path, process={"env": ["NVIDIA_VISIBLE_DEVICES=all"], "capabilities": {"bounding": ["CAP_CHOWN"]}})
    before = (b / "config.json").read_bytes()
    proc = run(front, "create", "--bundle", str(b), "c1")
    assert proc.returncode == 0, proc.stderr
    assert (b / "config.json").read_bytes() == before
    b = bundle(tmp_path, process={"env": ["NVIDIA_VISIBLE_DEVICES=all"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}})
    assert run(front, "create", "--bundle", str(b), "c1").returncode != 0     # privileged: Python (broken here)


def test_gpu_create_imports_no_heavy_modules(shim):
    """The shim's promise (docs/runtime.md): once the config is cached, a GPU create loads
    none of json, re, dataclasses, pathlib, yaml or jsonschema."""
    front, tmp_path = shim
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    assert run(front, "create", "--bundle", str(b), "c1").returncode == 0     # caches the config
    text = front.read_text()
    assert text.count(" -I -S -c ") == 1
    timed = tmp_path / "front-importtime"
    timed.write_text(text.replace(" -I -S -c ", " -X importtime -I -S -c "))
    timed.chmod(0o755)
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    proc = run(timed, "create", "--bundle", str(b), "c1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((b / "config.json").read_text())["linux"]["devices"]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert {"hostagent.runtime.shim", "hostagent.cdi.inject"} <= imported     # the report is complete
    heavy = {"json", "re", "dataclasses", "pathlib", "yaml", "jsonschema"}
    assert not {name for name in imported if name.split(".")[0] in heavy}

def test_missing_device_fails_naming_it_and_touches_nothing(shim):
    front, tmp_path = shim
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0,example.com/gpu=7"})
    before = (b / "config.json").read_bytes()
    log = tmp_path / "runc-log.json"
    proc = run(front, "--log", str(log), "--log-format", "json", "create", "--bundle", str(b), "c1")
    assert proc.returncode == 1
    assert "unresolvable CDI device example.com/gpu=7" in proc.stderr
    assert "devices offered: example.com/gpu=0" in proc.stderr
    assert (b / "config.json").read_bytes() == before
    assert called(tmp_path) is None                            # runc never ran
    entry = json.loads(log.read_text().splitlines()[-1])     # where containerd looks for the error
    assert entry["level"] == "error" and "example.com/gpu=7" in entry["msg"]
    assert "refused create" in (tmp_path / "shim.log").read_text()


def test_invalid_config_json_is_reported(shim):
    front, tmp_path = shim
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "config.json").write_text('{"annotations": {"cdi.k8s.io/x": "example.com/gpu=0"')
    proc = run(front, "create", "--bundle", str(b), "c1")
    assert proc.returncode == 1 and "not valid JSON" in proc.stderr and "Traceback" not in proc.stderr


def test_python_part_without_front(shim):
    """The console script works on its own (slower: it always starts Python)."""
    front, tmp_path = shim
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    proc = subprocess.run([sys.executable, "-m", "hostagent.runtime.shim", "--runtime", str(tmp_path / "bin/runc"),
                           "--config", str(tmp_path / "config.yaml"), "--cache-dir", str(tmp_path / "cache"),
                           "--", "create", "--bundle", str(b), "c1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((b / "config.json").read_text())["linux"]["devices"]


def test_config_cache_goes_to_the_run_dir_or_to_cache_dir(shim, capsys):
    """The Python part keeps its validated config in the node's /run/hostagent, or in
    --cache-dir; a relative --cache-dir is refused (engines run the front elsewhere)."""
    front, tmp_path = shim
    run_dir = tmp_path / "root/run/hostagent"
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    assert run(front, "create", "--bundle", str(b), "c1").returncode == 0
    cached = "config." + str(tmp_path / "config.yaml").replace("/", "_") + ".json"
    assert [p.name for p in run_dir.glob("config.*.json")] == [cached]

    cache = tmp_path / "cache"
    args = ["--simulate", str(tmp_path / "root"), "runtime", "install-shim", "--path", "/usr/sbin/other",
            "--low-level-runtime", str(tmp_path / "bin/runc"), "--agent-config", str(tmp_path / "config.yaml")]
    assert main([*args, "--cache-dir", "cache"]) == 2
    assert capsys.readouterr().err.startswith("hostagent: error: --cache-dir must be an absolute path, not 'cache'")
    assert not (tmp_path / "root/usr/sbin/other").exists()
    assert main([*args, "--cache-dir", str(cache)]) == 0
    for p in run_dir.glob("config.*.json"):
        p.unlink()
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    assert run(tmp_path / "root/usr/sbin/other", "create", "--bundle", str(b), "c1").returncode == 0
    assert json.loads((b / "config.json").read_text())["linux"]["devices"]
    assert [p.name for p in cache.glob("config.*.json")] == [cached] and not list(run_dir.glob("config.*.json"))
