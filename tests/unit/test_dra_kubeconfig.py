"""The DRA plugin's Kubernetes configuration: a missing, malformed or incomplete one is one
line naming the file and what to give, at start, never a traceback."""

import subprocess
import sys

import pytest

pytest.importorskip("lightkube", reason="lightkube is a dependency of the DRA plugin")

from hostagent.errors import ConfigError  # noqa: E402
from hostagent.plugins.dra.kube import load_config  # noqa: E402

GOOD = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize("text, words", [
    ("apiVersion: v1\nkind: Config\n", "is not a kubeconfig: no 'clusters'"),
    ("clusters: [\n", "is not YAML: expected the node content, but found '<stream end>' at line 2"),
    ("- a\n- b\n", "is not a kubeconfig: not a kubeconfig's shape"),
    (GOOD.replace("current-context: x", "current-context: nope"), "Context 'nope' not found"),
])
def test_a_kubeconfig_that_is_not_one_is_an_error_naming_it(tmp_path, text, words):
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(str(path), environ={})
    assert words in e.value.what and e.value.where == str(path)


def test_the_configuration_is_found_as_kubectl_finds_it(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(GOOD)
    assert load_config(None, environ={"KUBECONFIG": f":{path}:/elsewhere"}).cluster.server == "http://127.0.0.1:9"
    with pytest.raises(ConfigError, match=r"^/nowhere: no kubeconfig file /nowhere "):
        load_config(None, environ={"KUBECONFIG": "/nowhere"})
    with pytest.raises(ConfigError, match="no --kubeconfig, no KUBECONFIG, and no service account token"):
        load_config(None, environ={})


@pytest.mark.parametrize("argv, words", [
    (["--kubeconfig", "/nowhere/kubeconfig"], "no kubeconfig file /nowhere/kubeconfig"),
    (["--kubeconfig", "BROKEN"], "is not YAML"),
])
def test_the_command_says_it_in_one_line_and_exits_1(tmp_path, argv, words):
    (tmp_path / "broken").write_text("clusters: [\n")
    argv = [str(tmp_path / "broken") if a == "BROKEN" else a for a in argv]
    done = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "dra-plugin", "--node-name", "n1", *argv],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("hostagent: error: ") and words in line, done.stderr
