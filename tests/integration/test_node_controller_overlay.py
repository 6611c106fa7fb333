"""The node controller as packaging/kubernetes/node-controller runs it, against an agent of
the host's: its container's identity (the user, the groups, the capabilities and
no_new_privs of its securityContext, as the kubelet gives them) meets the agent's socket
rules (docs/api.md: the socket 0660 root and the agent's group, root's own admin.sock; root
may do everything), so it applies a MIG layout the node's label names."""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from tests.rootneeds import GPU_CHANGES
from tests.unit.test_kubernetes_overlays import pod
from tests.waiting import until

from .agentd import existing_group
from .dracluster import AGENT, NODE, Cluster

pytestmark = [GPU_CHANGES, pytest.mark.root("the controller is run as the container's user, root, which only root may "
                                            "become"),
              pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv (util-linux) is not installed")]

MIG_FILE = {"version": "v1", "mig-configs": {
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
    "all-1g.5gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]}}


def as_the_container(container: dict, pod_spec: dict) -> list[str]:
    """setpriv's options giving a process what the kubelet gives the container: its user and
    group (the image's root when none is named), no supplementary group, its capabilities
    (none with drop ALL) and no_new_privs without privilege escalation."""
    context, pod_context = container.get("securityContext") or {}, pod_spec.get("securityContext") or {}
    uid = context.get("runAsUser", pod_context.get("runAsUser", 0))
    gid = context.get("runAsGroup", pod_context.get("runAsGroup", 0))
    out = [f"--reuid={uid}", f"--regid={gid}"]
    groups = pod_context.get("supplementalGroups") or []
    out.append(f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups")
    assert not context.get("capabilities", {}).get("add")
    if "ALL" in context.get("capabilities", {}).get("drop", []):
        out += ["--bounding-set=-all", "--inh-caps=-all"]
    if context.get("allowPrivilegeEscalation") is False:
        out.append("--no-new-privs")
    return out


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """An agent with the host's socket rules: its group is one this machine has."""
    group, gid = existing_group()
    cluster = Cluster(dra_plugin=False, agent_config={**AGENT, "api": {**AGENT["api"], "group": group}})
    try:
        cluster.start()
        yield cluster, gid
    finally:
        cluster.close()


def test_the_overlays_container_is_the_agents_admin_on_its_socket(host, tmp_path):
    cluster, gid = host
    spec = pod("node-controller", "hostagent-node-controller")
    [container] = spec["containers"]
    assert spec.get("hostUsers", True) is True            # the host's root, not a user namespace's
    socket = cluster.agent.socket
    mode = os.stat(socket)
    assert (stat.S_IMODE(mode.st_mode), mode.st_uid, mode.st_gid) == (0o660, 0, gid)
    admin = os.stat(socket.parent / "admin.sock")
    assert (stat.S_IMODE(admin.st_mode), admin.st_uid) == (0o600, 0)
    mig = tmp_path / "mig.yaml"
    mig.write_text(json.dumps(MIG_FILE))
    log = tmp_path / "controller.log"
    with open(log, "wb") as out:
        controller = subprocess.Popen(
            ["setpriv", *as_the_container(container, spec), sys.executable, "-m", "hostagent.cli.main",
             "--simulate", str(cluster.root), "node-controller", "--kubeconfig", str(cluster.kubeconfig),
             "--node-name", NODE, "--namespace", "hostagent", "--mig-config", str(mig)],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        cluster.api.label_node(NODE, {"nvidia.com/mig.config": "all-1g.5gb"})
        state = until(lambda: (cluster.api.get("nodes", NODE)["metadata"].get("labels") or {}).get(
            "nvidia.com/mig.config.state") in ("success", "failed") and cluster.api.get("nodes", NODE),
            timeout=60, what=lambda: log.read_text(errors="replace"))
        assert state["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success", log.read_text()
        with cluster.agent.client() as a:
            assert len(a.devices(type="mig")["mig_devices"]) == 56
        with open(f"/proc/{controller.pid}/status") as f:
            status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        assert status["Uid"].split()[0] == "0" and int(status["CapEff"], 16) == 0 and status["NoNewPrivs"] == "1"
        assert grp.getgrgid(gid).gr_name and status["Groups"].strip() == ""
    finally:
        controller.terminate()
        controller.wait(15)
        with cluster.agent.client(timeout=None) as a:
            a.mig_apply("all-disabled", spec=MIG_FILE)
