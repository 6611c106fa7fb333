"""``hostagent device-plugin``'s flags: defaults under a simulated root, bad values refused
with a usage error before anything starts."""

import pytest

from hostagent.cli.device_plugin import options_from_args
from hostagent.cli.main import build_parser, main


def parse(*argv):
    argv = list(argv)
    return build_parser(argv).parse_args(argv)


def test_defaults_follow_the_simulated_root(tmp_path):
    o = options_from_args(parse("--simulate", str(tmp_path), "device-plugin"))
    assert o.plugin_dir == tmp_path / "var/lib/kubelet/device-plugins"
    assert o.agent_socket == tmp_path / "run/hostagent/hostagent.sock"
    assert o.pod_resources_socket == tmp_path / "var/lib/kubelet/pod-resources/kubelet.sock"
    assert o.mig_strategy is None and o.device_list_strategy == ("cdi-cri", "envvar") and o.cdi_names == "node"
    o = options_from_args(parse("device-plugin", "--pod-resources-socket", "none", "--device-list-strategy",
                                "edits, envvar,edits", "--allocation-expiry", "0"))
    assert o.pod_resources_socket is None and o.device_list_strategy == ("edits", "envvar")
    assert o.allocation_expiry == 0 and str(o.plugin_dir) == "/var/lib/kubelet/device-plugins"


@pytest.mark.parametrize("argv, words", [
    (["--device-list-strategy", "volume-mounts"], "choose from cdi-cri, envvar, edits"),
    (["--device-list-strategy", ","], "nothing"),
    (["--allocation-expiry", "-1"], "must not be negative"),
    (["--reconcile-interval", "soon"], "not a number"),
    (["--release-grace", "nan"], "not a number"),
    (["--release-grace", "inf"], "not a number"),
    (["--mig-strategy", "dynamic"], "invalid choice"),
])
def test_bad_flags_are_usage_errors(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        main(["device-plugin", *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_the_agent_writes_a_spec_only_when_the_plugin_answers_its_names():
    from hostagent.plugins.allocations import Allocations
    assert Allocations(None).agent_names == "node"
    assert Allocations(None, cdi_names="allocation").agent_names == "allocation"
    assert Allocations(None, ("envvar", "edits"), cdi_names="allocation").agent_names == "node"
