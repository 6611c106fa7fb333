"""What hostagent-dra-plugin.service's sandbox does to the plugin, said in one line with the
fix: ProtectHome=yes hides a kubeconfig under /root or /home (root without capabilities is
refused it), and ProtectSystem=strict leaves the kubelet's folders read-only when they did
not exist at the unit's start. Both are made here as systemd makes them: a private mount
namespace (an inaccessible tmpfs over /home, a read-only bind mount) and no capabilities."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from .kubeapi import kubeconfig

pytestmark = pytest.mark.root("mount namespaces need root")


@pytest.fixture(autouse=True)
def tools():
    missing = [t for t in ("unshare", "setpriv", "mount") if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def plugin(make_node, tmp_path, shell: str, *args: str) -> subprocess.CompletedProcess:
    host, _ = make_node("t4x2")
    kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")          # an API server nobody runs
    command = " ".join([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), "dra-plugin",
                        "--node-name", "node-1", *args])
    return subprocess.run(["unshare", "-m", "sh", "-c", f"{shell} && exec {command}"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_a_kubeconfig_the_sandbox_hides_says_where_to_put_it():
    """/home made inaccessible, as ProtectHome=yes does, and the plugin run as root without
    capabilities (the unit's empty CapabilityBoundingSet=), so root may not enter it."""
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o mode=000 tmpfs /home && exec setpriv --bounding-set=-all "
         f"--inh-caps=-all {sys.executable} -m hostagent.cli.main dra-plugin --node-name node-1 "
         "--kubeconfig /home/admin/.kube/config"], capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("hostagent: error: /home/admin/.kube/config: cannot read the kubeconfig: "
                                  "Permission denied (hostagent-dra-plugin.service and "
                                  "hostagent-node-controller.service run with ProtectHome=yes")
    assert "name it as KUBECONFIG in /etc/hostagent/dra-plugin.env (or node-controller.env)" in done.stderr


def test_kubelet_folders_the_sandbox_keeps_read_only_say_how_to_make_them_writable(make_node, tmp_path):
    plugins = tmp_path / "plugins"
    registry = tmp_path / "plugins_registry"
    plugins.mkdir()
    registry.mkdir()
    done = plugin(make_node, tmp_path, f"mount --bind -o ro {plugins} {plugins}", "--kubeconfig",
                  str(tmp_path / "kubeconfig"), "--plugin-dir", str(plugins / "gpu.nvidia.com"),
                  "--plugin-registry", str(registry))
    # One error line (the plugin's link to the agent, started first, may warn beside it).
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert errors[0].startswith(f"hostagent: error: cannot serve the kubelet: {plugins / 'gpu.nvidia.com'}: "
                                  "Read-only file system (hostagent-dra-plugin.service may write only in ")
    assert "mkdir -p both, then systemctl restart hostagent-dra-plugin" in done.stderr
