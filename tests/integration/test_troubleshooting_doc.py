"""docs/troubleshooting.md lists what a new admin meets: each message below, as the command
prints it, has its row there."""

from pathlib import Path

import pytest

from hostagent.cli.main import main

DOC = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()

FLOAT = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2.5\n"
UNKNOWN = "version: v1\nsharing:\n  mps:\n    x: 1\n    resources:\n    - name: gpu\n      replicas: 2\n"


def no_os_release(root):
    (root / "etc/os-release").unlink()


def debian_main_only(root):
    (root / "etc/apt/sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n")


@pytest.mark.parametrize("argv, says, prepare", [
    (["--simulate", "{empty}", "cdi", "refresh"],
     "not a simulated node (no .sim/node.json) (make it one first: ", None),
    (["--simulate", "{node}", "sim", "hold", "9"], "no device '9' on the simulated node", None),
    (["--simulate", "{node}", "sharing", "apply", "--dry-run", "-f", "{float}"],
     "replicas: must be of type integer, not a number", None),
    (["--simulate", "{node}", "sharing", "apply", "--dry-run", "-f", "{unknown}"],
     "sharing.mps: unknown key 'x', ignored (as the device plugin ignores it)", None),
    (["--simulate", "{node}", "allocations", "list"],
     "the hostagent daemon does not run: allocations live in it", None),
    (["--simulate", "{node}", "mig", "apply", "--dry-run", "-c", "nosuch"], "no MIG config named ", None),
    (["--simulate", "{node}", "driver", "plan", "--version", "550.127.05"],
     "the host says no distribution: no /etc/os-release", no_os_release),
    (["--simulate", "{node}", "driver", "plan", "--version", "550.127.05"],
     "(Debian ships the driver in its non-free component", debian_main_only),
    (["--simulate", "{node}", "node-controller", "--kubeconfig", "{empty}/kc"], "no node name (give --node-name", None),
    (["--simulate", "{node}", "node-controller", "--node-name", "n", "--sharing-configs", "{empty}/nosuch"],
     "the sharing configs folder does not exist", None),
    (["--simulate", "{node}", "node-controller", "--node-name", "n", "--default-sharing-config", "x"],
     "--default-sharing-config needs --sharing-configs DIR", None),
], ids=["not-a-node", "unknown-device", "fraction", "unknown-key", "no-daemon", "mig-config", "no-distro",
        "non-free", "no-node-name", "no-sharing-folder", "default-without-folder"])
def test_the_message_has_its_row(make_node, tmp_path, capsys, argv, says, prepare):
    host, _ = make_node("a30x4")
    if prepare:
        prepare(host.root)
    (tmp_path / "empty").mkdir()
    (tmp_path / "float.yaml").write_text(FLOAT)
    (tmp_path / "unknown.yaml").write_text(UNKNOWN)
    names = {"node": host.root, "empty": tmp_path / "empty", "float": tmp_path / "float.yaml",
             "unknown": tmp_path / "unknown.yaml"}
    try:
        main([a.format(**names) for a in argv])
    except SystemExit:
        pass
    err = capsys.readouterr().err
    assert says in err, err
    assert says in DOC, f"docs/troubleshooting.md lacks {says!r}"
