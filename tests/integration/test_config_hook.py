"""The hook section of /etc/hostagent/config.yaml reaches the specs `hostagent cdi` writes."""

import json
import os
import subprocess
import sys

from hostagent.cli.main import main
from tests.programs import script


def hook_paths(spec):
    edits = [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]
    return {h["path"] for e in edits for h in e.get("hooks", [])}


def test_hook_interpreter(make_node, capsys):
    host, _ = make_node("a30x4")
    assert main(["--simulate", str(host.root), "cdi", "generate"]) == 0
    assert hook_paths(json.loads(capsys.readouterr().out)) == {sys.executable}      # the default

    host.config_file.parent.mkdir(parents=True, exist_ok=True)
    host.config_file.write_text("hook:\n  interpreter: /opt/hostagent/bin/python3\n")
    assert main(["--simulate", str(host.root), "cdi", "generate"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert hook_paths(spec) == {"/opt/hostagent/bin/python3"}
    hook = spec["containerEdits"]["hooks"][0]
    assert hook["args"][:2] == ["/opt/hostagent/bin/python3", "-I"]


def test_invalid_config_stops_generation(make_node, capsys):
    host, _ = make_node("a30x4")
    host.config_file.parent.mkdir(parents=True, exist_ok=True)
    host.config_file.write_text("hook:\n  interpreter: python3\n")
    assert main(["--simulate", str(host.root), "cdi", "generate"]) == 1
    assert "hook.interpreter: 'python3' must be an absolute path" in capsys.readouterr().err


def without_hooks(spec):
    """The spec with every hook taken out (and the version it then needs)."""
    from hostagent.cdi.version import minimum_version
    out = json.loads(json.dumps(spec))
    for edits in [out["containerEdits"]] + [d["containerEdits"] for d in out["devices"]]:
        edits.pop("hooks", None)
    out["cdiVersion"] = minimum_version(out)
    return out


def test_a_simulated_node_may_give_specs_without_the_hook_and_nothing_else_changes(make_node, capsys):
    host, _ = make_node("dgx-a100")
    assert main(["--simulate", str(host.root), "cdi", "generate"]) == 0
    with_hook = json.loads(capsys.readouterr().out)
    assert hook_paths(with_hook) == {sys.executable}

    host.config_file.parent.mkdir(parents=True, exist_ok=True)
    host.config_file.write_text("hook:\n  in_cdi_specs: false\n")
    assert main(["--simulate", str(host.root), "cdi", "generate"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert hook_paths(spec) == set() and spec == without_hooks(with_hook)
    assert len([d for d in spec["devices"] if d["name"].isdigit()]) == 8
    # refresh writes the same spec where engines read it.
    assert main(["--simulate", str(host.root), "cdi", "refresh"]) == 0
    assert json.loads((host.cdi_dir / "nvidia.com-gpu.json").read_text()) == spec


def test_a_real_node_refuses_specs_without_the_hook_and_writes_nothing(tmp_path, capsys):
    """A host's / mounted (a DaemonSet's /host) and this machine's own: the setting is
    refused before anything is read or written, by the commands and by the daemon."""
    config = tmp_path / "config.yaml"
    config.write_text("hook:\n  in_cdi_specs: false\n")
    expected = f"{config}: hook.in_cdi_specs: false is for a simulated node only (remove it:"
    host = tmp_path / "host"
    host.mkdir()
    env = {**os.environ, "HOSTAGENT_CONFIG": str(config)}
    for args in (["--host-root", str(host), "cdi", "refresh"], ["cdi", "generate"]):
        done = subprocess.run([script("hostagent"), *args], capture_output=True, text=True, timeout=60,
                              env=env)
        assert done.returncode == 1 and expected in done.stderr, done.stderr
    assert list(host.iterdir()) == []
    done = subprocess.run([script("hostagentd"), "--config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and f"cannot start: {expected}" in done.stderr, done.stderr
