"""What every command gets from the CLI, checked on every registered command and program:
--help and --version, the global options after the command, its own usage on a mistake,
and, run by a user who is not root, a one-line error that says how to run it as root.

A new command fails ``test_every_command_has_a_sample`` until SAMPLES holds an invocation
of it; the non-root check then runs that invocation."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hostagent.cli.main import build_parser, main
from hostagent.sim.driverroot import create_node
from hostagent.sim.platform import simulated_host
from tests.programs import PROGRAMS, script
from tests.runfolder import readable_copy

# One invocation of each command (after "hostagent --simulate ROOT"), on an a30x4 node
# whose CDI spec exists, with containerd's folders; ROOT is the node.
SAMPLES = {
    "devices": [], "topo": [], "node": [], "labels": ["--write"], "serve": [], "device-plugin": [],
    "dra-plugin": ["--node-name", "node-1", "--kubeconfig", "ROOT/kubeconfig"],
    "dra-webhook": ["--tls-cert", "ROOT/tls.crt", "--tls-key", "ROOT/tls.key"],
    "node-controller": ["--node-name", "node-1", "--kubeconfig", "ROOT/kubeconfig", "--dry-run"],
    "health status": [], "health watch": [], "health clear": ["--all"],
    "cdi generate": ["--output", "ROOT/spec.json"], "cdi refresh": [], "cdi list": [],
    "cdi validate": ["ROOT/var/run/cdi/nvidia.com-gpu.json"],
    "mig apply": ["-c", "all-balanced"], "mig assert": ["-c", "all-disabled"],
    "mig plan": ["-c", "all-balanced"], "mig export": [], "mig status": [],
    "runtime configure": ["--runtime", "containerd"], "runtime revert": ["--runtime", "containerd"],
    "runtime install-shim": [],
    "sim profiles": [], "sim create": ["--root", "ROOT/another"], "sim demo": ["--profile", "t4x2"],
    "sim hold": ["0"], "sim load": ["0", "--sm", "50", "--pcie-rx", "100"], "sim release": [],
    "sim xid": ["--gpu", "0", "--xid", "48"], "sim ecc": ["--gpu", "0"],
    "sim lose": ["--gpu", "1"], "sim events": ["--gpu", "0", "off"],
    "sim topology": ["--gpu", "0", "off"], "sim reboot": [],
    "sim driver": ["unload"], "sim fault": ["no-uvm"], "sim iommu": ["on"],
    "driver verify": [], "driver plan": ["--version", "550.90.07"],
    "driver install": ["--version", "550.90.07", "--dry-run"], "driver rollback": ["--dry-run"],
    "driver create-nodes": ["--dry-run"],
    "sharing status": [], "sharing apply": ["-f", "ROOT/sharing.yaml"], "sharing off": [],
    "allocations list": [], "allocations release": ["an-allocation"], "allocations dismiss-unreadable": [],
}
# These change the node: as another user they must be refused, saying how to run them.
NEED_ROOT = {"labels", "serve", "device-plugin", "dra-plugin", "health clear", "cdi refresh", "mig apply",
             "runtime configure", "runtime revert", "runtime install-shim", "sim create", "sim hold", "sim load",
             "sim xid", "sim reboot", "sim driver", "sim fault", "sim iommu", "sharing apply", "sharing off"}


def leaves(parser=None, words=()):
    """(words, parser) of every command and verb that runs something."""
    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(words), parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaves(sub, (*words, name))


COMMANDS = dict(leaves())


def run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_command_has_a_sample():
    assert set(COMMANDS) == set(SAMPLES), "give each new command a sample invocation in SAMPLES"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_usage_and_global_options(command, capsys):
    words = command.split()
    code, out, err = run([*words, "--help"], capsys)
    assert (code, err) == (0, "") and out.startswith(f"usage: hostagent {command} ")
    assert "global options (before or after the command):" in out and "--simulate DIR" in out
    # A mistake is one line from this command's parser (not the top level's), naming the
    # option and where the options are listed, with no usage block.
    code, out, err = run([*words, *SAMPLES[command], "--simulte=/x"], capsys)
    assert code == 2 and out == ""
    assert err == (f"hostagent {command}: error: unrecognized arguments: --simulte=/x "
                   f"(did you mean '--simulate'?) (see hostagent {command} --help)\n")
    # The global options parse after the command's words, and win there.
    parser = COMMANDS[command]
    ns, _ = parser.parse_known_args(["--simulate", "/after", "-v", *SAMPLES[command]])
    assert ns.simulate == "/after" and ns.verbose is True


def test_global_options_before_and_after_the_command_agree(make_node, capsys):
    host, _ = make_node("t4x2")
    root = str(host.root)
    before = run(["-v", "-o", "json", "--simulate", root, "devices"], capsys)
    after = run(["devices", "--simulate", root, "-v", "-o", "json"], capsys)
    assert before[0] == after[0] == 0 and json.loads(before[1]) == json.loads(after[1])
    assert run(["--simulate", "/nonexistent", "sim", "profiles", "--simulate", root], capsys)[0] == 0
    code, _, err = run(["-o", "xml", "devices", "--simulate", root], capsys)
    assert code == 2 and "hostagent devices: error: argument -o/--output: invalid choice: 'xml'" in err


@pytest.mark.parametrize("argv, message", [
    (["devics"], "invalid choice: 'devics' (choose from"),
    (["cdi", "generat"], "(did you mean 'generate'?)"),
    (["devices", "--profils"], "unrecognized arguments: --profils (did you mean '--profiles'?)"),
    (["sim", "create", "--root", "x", "--profile", "dgx-a10"],
     "unknown simulated node profile 'dgx-a10' (did you mean 'dgx-a100'?)"),
    (["sim", "create", "--root", "x", "--engines", "containerd,cryo"], "unknown engine 'cryo' (did you mean 'crio'?)"),
])
def test_usage_errors_exit_2_with_a_suggestion(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and message in err, err
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("argv, line", [
    (["sim", "load", "0", "--sm", "120"],
     "hostagent sim load: error: argument --sm: 120 is not a percentage (0-100) (see hostagent sim load --help)"),
    (["sim", "load", "0", "--gr", "nan"],
     "hostagent sim load: error: argument --gr: nan is not a percentage (0-100) (see hostagent sim load --help)"),
    (["devices", "-o", "xml"], "hostagent devices: error: argument -o/--output: invalid choice: 'xml' "),
    (["sim", "xid", "--gpu", "0"], "hostagent sim xid: error: the following arguments are required: --xid "),
    (["mig", "apply", "--lock-timeout"], "hostagent mig apply: error: argument --lock-timeout: expected one argument "),
])
def test_an_option_error_is_one_line_naming_the_option_and_help(argv, line, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(line), err
    assert err.rstrip().endswith(" --help)"), err


@pytest.mark.parametrize("program, args, line", [
    ("hostagentd", ["--bogus"], "hostagentd: error: unrecognized arguments: --bogus (see hostagentd --help)"),
    ("hostagentd", ["--log-level", "loud"], "hostagentd: error: argument --log-level: invalid choice: 'loud' "),
    ("hostagent-runtime", ["--config"],
     "hostagent-runtime: error: --config needs a value (see hostagent-runtime --help)"),
])
def test_the_other_programs_say_an_option_error_in_one_line(program, args, line):
    done = subprocess.run([script(program), *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(line), done.stderr


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_program_answers_help_and_version(program):
    from hostagent import __version__
    path = script(program)
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith(f"{program} ") and __version__ in version.stdout
    helped = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stderr == "", helped.stderr
    assert helped.stdout.lstrip().startswith(("usage:", program)) and len(helped.stdout.splitlines()) >= 4


@pytest.fixture(scope="module")
def shared_node():
    """A node another user can traverse but not change (owned by root, mode 0755)."""
    import shutil
    from hostagent.cdi.refresh import configured_options, refresh
    root = Path(tempfile.mkdtemp(prefix="ha-nonroot-"))
    root.chmod(0o755)
    create_node(root, "a30x4")
    (root / "etc/containerd").mkdir(parents=True)
    (root / "usr/local/sbin").mkdir(parents=True)
    (root / "sharing.yaml").write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                       "    - {name: nvidia.com/gpu, replicas: 2}\n")
    from .kubeapi import kubeconfig
    kubeconfig(root / "kubeconfig", "http://127.0.0.1:9").chmod(0o644)    # an API server nobody runs
    host = simulated_host(root)
    refresh(host, configured_options(host))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run commands as another user")
def test_every_command_run_by_another_user_says_how_to_run_it_as_root(shared_node):
    lines = "".join(json.dumps(["--simulate", "ROOT", *c.split(), *SAMPLES[c]]) + "\n" for c in SAMPLES)
    lines += json.dumps(["daemon:", "--simulate", "ROOT"]) + "\n"      # hostagentd
    # The commands run from a copy nobody may read: this checkout may be in a private folder.
    copy = readable_copy((Path(__file__).with_name("nonroot.py"),))
    done = subprocess.run([sys.executable, str(copy / "nonroot.py"), str(shared_node)], input=lines,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(copy)})
    assert done.returncode == 0, done.stderr
    results = dict(zip([*SAMPLES, "hostagentd"], (json.loads(line) for line in done.stdout.splitlines())))
    assert len(results) == len(SAMPLES) + 1
    code, out = results.pop("hostagentd")[1:]
    # The log's line naming the configuration in force, then the error.
    assert code == 1 and out.splitlines()[0].startswith("hostagentd: info: configuration: ")
    assert out.splitlines()[-1].startswith("hostagentd: error: cannot start: ") and "Traceback" not in out
    assert out.rstrip().endswith("the daemon runs as root: systemctl start hostagent, or sudo hostagentd"), out
    for command, (argv, code, out) in results.items():
        assert "Traceback" not in out, f"{command}:\n{out}"
        if command in NEED_ROOT:
            assert code == 1, f"{command} did not fail for another user:\n{out}"
        if code != 0:           # notes may come first; the error is the last line, and the only one
            errors = [line for line in out.splitlines() if line.startswith("hostagent: error: ")]
            assert len(errors) == 1 and out.strip().splitlines()[-1] == errors[0], f"{command}:\n{out}"
        if code != 0 and "ermission denied" in out:
            assert "run it as root" in out and f"sudo hostagent {' '.join(argv)}" in out, f"{command}:\n{out}"
