"""The hook section of /etc/hostagent/config.yaml reaches the specs `hostagent cdi` writes."""

import json
import sys

from hostagent.cli.main import main
from tests.rootneeds import DEVICE_NODES


def hook_paths(spec):
    edits = [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]
    return {h["path"] for e in edits for h in e.get("hooks", [])}


@DEVICE_NODES
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
