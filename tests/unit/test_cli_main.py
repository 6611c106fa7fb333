"""The CLI builds only the parser of the command it runs."""

import subprocess
import sys

import pytest

from hostagent.cli.main import COMMANDS, build_parser
from hostagent.cli.parser import command_word, hoist_output


@pytest.mark.parametrize("argv, word", [
    (["devices", "-o", "json"], "devices"),
    (["--simulate", "devices", "node"], "node"),        # the option's value is not the command
    (["--simulate=/x", "-v", "mig", "status"], "mig"),
    (["--sim", "node", "devices"], "devices"),          # argparse's abbreviations take a value too
    (["--s", "node", "devices"], "devices"),
    (["--sim=node", "devices"], "devices"),
    (["-o", "devices", "node"], "node"),                # -o's value is not the command either
    (["--out", "json", "-ojson", "devices"], "devices"),
    (["-v", "bogus", "devices"], None),                   # an unknown word: no command
    (["--", "devices"], None),
    (["--version"], None),
    ([], None),
])
def test_command_word(argv, word):
    at = command_word(argv, COMMANDS)
    assert (None if at is None else argv[at]) == word


@pytest.mark.parametrize("argv, hoisted", [
    (["-o", "json", "devices"], ["devices", "-o", "json"]),
    (["-v", "-ojson", "--simulate", "/x", "mig", "status"], ["-v", "--simulate", "/x", "mig", "status", "-ojson"]),
    (["--out=yaml", "health", "clear", "0", "--", "1"], ["health", "clear", "0", "--out=yaml", "--", "1"]),
    (["devices", "-o", "json"], ["devices", "-o", "json"]),     # after the command already
    (["-o", "json"], ["-o", "json"]),                           # no command: the top level says so
])
def test_output_before_the_command_is_moved_behind_it(argv, hoisted):
    assert hoist_output(argv, command_word(argv, COMMANDS)) == hoisted


def _commands(parser):
    return set(parser._subparsers._group_actions[0].choices)


def test_each_command_parses_with_only_its_own_parser():
    for name in COMMANDS:
        assert _commands(build_parser([name, "--help"])) == {name}
    assert _commands(build_parser(["--help"])) == set(COMMANDS)
    assert _commands(build_parser(["bogus"])) == set(COMMANDS)    # the error lists every choice
    assert _commands(build_parser(["--version"])) == set()


def test_version_and_a_command_import_no_other_command_module():
    code = ("import sys; from hostagent.cli.main import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('hostagent.cli.')))")
    run = lambda *argv: subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                                       text=True, check=True).stdout.splitlines()[-1]
    assert "hostagent.cli.devices" not in run("--version")
    loaded = run("node", "--help")
    assert "hostagent.cli.node" in loaded
    assert not [m for m in COMMANDS if m != "node" and f"hostagent.cli.{m}'" in loaded]


def test_only_a_running_dra_plugin_loads_the_kubernetes_client():
    """The agent, the hook, the CLI's start-up and every other command never pay for lightkube."""
    code = ("import sys; from hostagent.cli.main import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "import hostagent.daemon.main, hostagent.hooks.main, hostagent.plugins.deviceplugin, "
            "hostagent.plugins.dra.plugin\n"
            "print(sorted(m for m in ('lightkube', 'httpx2', 'msgspec') if m in sys.modules))")
    for argv in (["--help"], ["dra-plugin", "--help"], ["devices", "--help"], ["device-plugin", "--help"]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
        assert done.stdout.splitlines()[-1] == "[]", argv
