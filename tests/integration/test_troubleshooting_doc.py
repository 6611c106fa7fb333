"""docs/troubleshooting.md lists what a new admin meets: every error message the code can
raise has its row there (found in the code itself: ``errorsites``), and so do the messages
of the packages' build and maintainer scripts; the messages below, as the commands print
them, are checked against the page as printed."""

import ast
import re
from pathlib import Path

import pytest

from hostagent.cli.main import main

from .errorsites import ErrorSite, error_sites, page_lines, rows_for

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "troubleshooting.md").read_text()
LINES = page_lines(DOC)


def test_every_error_the_code_raises_has_its_row():
    missing = [f"{site.where}: {site.error}({site.template!r})" for site in error_sites()
               if not rows_for(site, LINES)]
    assert not missing, ("docs/troubleshooting.md has no row saying these messages (their constant "
                         "parts, in order, on one line):\n" + "\n".join(missing))


def test_the_scan_finds_every_kind_of_raise_site():
    sites = {s.where.split(":")[0]: s for s in error_sites()}
    # A HostagentError subclass of a command, the hook's own error, a DRA claim's error.
    for path in ("hostagent/cli/topo.py", "hostagent/hooks/ocistate.py", "hostagent/plugins/dra/claims.py",
                 "hostagent/sim/rootdir.py"):
        assert path in sites, path
    assert len(error_sites()) > 300
    # A message the page does not say is found missing, whatever its filled-in parts.
    invented = ErrorSite("x.py:1", "UsageError", ("no flux capacitor on GPU", "(it has", ")"))
    assert rows_for(invented, LINES) == []
    assert rows_for(invented, page_lines("| `no flux capacitor on GPU 3 (it has 2)` | it means | do |"))


def _packaging_messages() -> list[tuple[str, tuple[str, ...]]]:
    """What build.py exits with (``sys.exit(f"build.py: ...")``) and the maintainer scripts
    say on stderr (``echo "hostagent: ..." >&2``), as constant parts."""
    out = []
    build = REPO / "packaging/build.py"
    for node in ast.walk(ast.parse(build.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "exit" and node.args
                and isinstance(node.args[0], ast.JoinedStr)):
            parts = [v.value for v in node.args[0].values if isinstance(v, ast.Constant)]
            out.append((f"packaging/build.py:{node.lineno}", tuple(p.strip() for p in parts if p.strip())))
    for script in sorted((REPO / "packaging/common").glob("*.sh")):
        for m in re.finditer(r'echo "(hostagent: [^"]*)" >&2', script.read_text()):
            parts = re.split(r"\$\w+", m.group(1))
            out.append((script.name, tuple(p.strip() for p in parts if p.strip())))
    return out


def test_every_packaging_message_has_its_row():
    found = _packaging_messages()
    assert len(found) >= 7
    missing = [f"{where}: {' ... '.join(parts)}" for where, parts in found
               if not rows_for(ErrorSite(where, "exit", parts), LINES)]
    assert not missing, "docs/troubleshooting.md lacks:\n" + "\n".join(missing)

FLOAT = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2.5\n"
UNKNOWN = "version: v1\nsharing:\n  mps:\n    x: 1\n    resources:\n    - name: gpu\n      replicas: 2\n"
# An A30 has 4 1g.6gb instances; the 1g.12gb profile is an H100's.
TOOMANY = ("version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n"
           "      mig-devices: {\"1g.6gb\": 5}\n  y:\n    - devices: all\n      mig-enabled: true\n"
           "      mig-devices: {\"1g.12gb\": 1}\n")


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
    (["--simulate", "{node}", "topo", "9"], "hostagent: error: no GPU '9' on this node", None),
    (["--simulate", "{node}", "sim", "load", "0", "--sm", "120"],
     "argument --sm: 120 is not a percentage (0-100) (see hostagent sim load --help)", None),
    (["--simulate", "{node}", "dra-plugin"], "no node name (give --node-name NAME or set NODE_NAME", None),
    (["--simulate", "{node}", "dra-plugin", "--node-name", "n", "--kubeconfig", "{empty}/kubeconfig"],
     "no kubeconfig file ", None),
    (["--simulate", "{node}", "mig", "apply", "--dry-run", "-f", "{toomany}", "-c", "x"],
     "1g.6gb need more than the 4 1g.6gb GPU instances the GPU allows", None),
    (["--simulate", "{node}", "mig", "apply", "--dry-run", "-f", "{toomany}", "-c", "y"],
     "no MIG profile '1g.12gb'; the profiles are ", None),
    (["--simulate", "{node}", "sim", "create", "--root", "{node}"], "a simulated node already exists there", None),
    (["--simulate", "{node}", "serve", "--config", "{empty}/typo.yaml"], "no such file (give an existing file, or "
     "leave --config out", None),
    (["--simulate", "{node}", "node-controller", "--kubeconfig", "{empty}/kc"], "no node name (give --node-name", None),
    (["--simulate", "{node}", "node-controller", "--node-name", "n", "--sharing-configs", "{empty}/nosuch"],
     "the sharing configs folder does not exist", None),
    (["--simulate", "{node}", "node-controller", "--node-name", "n", "--default-sharing-config", "x"],
     "--default-sharing-config needs --sharing-configs DIR", None),
], ids=["not-a-node", "unknown-device", "fraction", "unknown-key", "no-daemon", "mig-config", "no-distro",
        "non-free", "topo", "sim-load", "dra-node-name", "dra-kubeconfig", "mig-does-not-fit", "mig-unknown-profile",
        "sim-exists", "missing-config", "no-node-name", "no-sharing-folder", "default-without-folder"])
def test_the_message_has_its_row(make_node, tmp_path, capsys, argv, says, prepare):
    host, _ = make_node("a30x4")
    if prepare:
        prepare(host.root)
    (tmp_path / "empty").mkdir()
    (tmp_path / "float.yaml").write_text(FLOAT)
    (tmp_path / "unknown.yaml").write_text(UNKNOWN)
    (tmp_path / "toomany.yaml").write_text(TOOMANY)
    names = {"node": host.root, "empty": tmp_path / "empty", "float": tmp_path / "float.yaml",
             "unknown": tmp_path / "unknown.yaml", "toomany": tmp_path / "toomany.yaml"}
    try:
        main([a.format(**names) for a in argv])
    except SystemExit:
        pass
    err = capsys.readouterr().err
    assert says in err, err
    [line] = [line for line in err.splitlines() if says in line]
    # The page says it: the message as printed, or its row with the values filled in otherwise.
    message = line.split("error: ", 1)[-1]
    parts = tuple(p for p in re.split(r"'[^']*'|\b\d+\b|/\S+", message.split(" (", 1)[0]) if p.strip())
    assert says in DOC or rows_for(ErrorSite("", "", tuple(p.strip() for p in parts)), LINES), (
        f"docs/troubleshooting.md lacks {message!r}")
