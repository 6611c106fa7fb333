"""A simulated cluster of GPU nodes for fleet-wide driver upgrades: the test API server, and
per node a simulated node root (4x A30, Debian 12, driver 550.90.07), its agent and
``hostagent --simulate ROOT node-controller --kubeconfig KC --node-name N --namespace NS``
as child processes; plus the Pods, ConfigMap and history the checks read."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hostagent.plugins.nodecontroller.upgradeplan import WALK

from .agentd import AgentProcess, make_root, running_agent
from .kubeapi import TestApiServer

__all__ = ["Fleet", "NAMESPACE", "STATE", "pod"]

NAMESPACE = "hostagent"
STATE = "nvidia.com/gpu-driver-upgrade-state"
AGENT = {"api": {"watch_heartbeat": 2}, "daemon": {"resync_interval": 0}, "driver": {"interval": 0},
         "health": {"quiet_period": None, "wait_timeout_ms": 200}}


def pod(namespace: str, name: str, node: str, gpus: int = 0, daemonset: bool = False) -> dict:
    """A running Pod bound to ``node`` (``gpus``: its container's nvidia.com/gpu limit)."""
    container = {"name": "main", "image": "registry.example/job:1"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    meta = {"name": name, "namespace": namespace}
    if daemonset:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name.rsplit("-", 1)[0],
                                    "uid": "5a1d3c2e-0000-4000-8000-000000000001", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [container]}, "status": {"phase": "Running"}}


@dataclass
class Member:
    name: str
    root: Path
    agent: AgentProcess
    log: Path
    controller: subprocess.Popen | None = None
    extra: list = field(default_factory=list)


class Fleet:
    def __init__(self, names=("node-1", "node-2", "node-3"), profile: str = "a30x4"):
        self.api = TestApiServer((1, 34))
        self.work = Path(tempfile.mkdtemp(prefix="fleet-"))
        self._agents = contextlib.ExitStack()
        self.nodes: dict[str, Member] = {}
        for name in names:
            agent = self._agents.enter_context(running_agent(make_root(profile), AGENT, start=False))
            self.nodes[name] = Member(name, agent.root, agent, self.work / f"{name}-controller.log")

    # ---- life -------------------------------------------------------------------------

    def start(self) -> "Fleet":
        self.api.start()
        self.kubeconfig = self.api.kubeconfig(self.work / "kubeconfig")
        for name, member in self.nodes.items():
            self.api.add_node(name)
            member.agent.start()
        for name in self.nodes:
            self.start_controller(name)
        return self

    def start_controller(self, name: str) -> subprocess.Popen:
        member = self.nodes[name]
        cmd = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(member.root), "node-controller",
               "--kubeconfig", str(self.kubeconfig), "--node-name", name, "--namespace", NAMESPACE]
        with open(member.log, "ab") as log:
            member.controller = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        return member.controller

    def dry_run(self, name: str) -> subprocess.CompletedProcess:
        """``node-controller --dry-run`` for the node: what it would do now."""
        member = self.nodes[name]
        return subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(member.root),
                               "node-controller", "--kubeconfig", str(self.kubeconfig), "--node-name", name,
                               "--namespace", NAMESPACE, "--dry-run"], capture_output=True, text=True, timeout=60)

    def kill_controller(self, name: str) -> None:
        proc = self.nodes[name].controller
        proc.send_signal(signal.SIGKILL)
        proc.wait(15)

    def close(self) -> None:
        try:
            for member in self.nodes.values():
                if member.controller is not None and member.controller.poll() is None:
                    member.controller.send_signal(signal.SIGTERM)
                    try:
                        member.controller.wait(15)
                    except subprocess.TimeoutExpired:
                        member.controller.kill()
                        member.controller.wait()
            self.api.stop()
        finally:
            self._agents.close()            # the agents stopped, the nodes removed
            shutil.rmtree(self.work, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {m.name} controller\n{m.log.read_text(errors='replace')[-2500:]}"
                         for m in self.nodes.values() if m.log.exists())

    # ---- what the checks read -------------------------------------------------------------

    def node(self, name: str) -> dict:
        return self.api.get("nodes", name)

    def state(self, name: str) -> str:
        return (self.node(name)["metadata"].get("labels") or {}).get(STATE, "")

    def states(self) -> dict[str, str]:
        return {name: self.state(name) for name in self.nodes}

    def cordoned(self, name: str) -> bool:
        return bool((self.node(name).get("spec") or {}).get("unschedulable"))

    def history(self, since: int = 0) -> list[tuple[int, str, str, bool]]:
        """Every change of a Node as the API server recorded it, from resourceVersion
        ``since``: (resourceVersion, node, its state label, cordoned)."""
        with self.api._cond:
            changes = [(rv, o) for rv, r, _, o in self.api._events if r == "nodes" and rv > since]
        return [(rv, o["metadata"]["name"], (o["metadata"].get("labels") or {}).get(STATE, ""),
                 bool((o.get("spec") or {}).get("unschedulable"))) for rv, o in changes]

    def most_walking(self, since: int = 0) -> int:
        """The most nodes at once between cordon-required and uncordon-required."""
        now: dict[str, str] = {}
        most = 0
        for _, name, state, _ in self.history(since):
            now[name] = state
            most = max(most, sum(1 for s in now.values() if s in WALK))
        return most

    def revision(self) -> int:
        with self.api._cond:
            return self.api._rv

    def configmap(self, **data) -> dict:
        """Create or change the ConfigMap hostagent-driver (``None``: a key removed)."""
        data = {k: (None if v is None else str(v)) for k, v in data.items()}
        if self.api.get("configmaps", "hostagent-driver", NAMESPACE) is None:
            return self.api.create({"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "hostagent-driver", "namespace": NAMESPACE},
                                    "data": {k: v for k, v in data.items() if v is not None}})
        return self.api.patch("configmaps", "hostagent-driver", {"data": data}, NAMESPACE)

    def verified(self, name: str) -> str | None:
        with self.nodes[name].agent.client() as c:
            driver = c.driver()
        return driver["version"] if driver["state"] == "ready" else None

    def installs(self, name: str, version: str) -> int:
        """How many installs of ``version`` the node's agent started."""
        return self.nodes[name].agent.log().count(f"driver install of {version} started")

    def lease_marks(self) -> dict[str, str]:
        return {l["metadata"]["name"]: json.loads(l["metadata"]["annotations"]["hostagent.io/driver-upgrade.failed"])
                for l in self.api.list("leases", NAMESPACE)
                if "hostagent.io/driver-upgrade.failed" in (l["metadata"].get("annotations") or {})}
