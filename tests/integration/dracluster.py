"""A one-node test cluster for the DRA plugin and the node controller: the test API server,
the real agent on a simulated node, the test kubelet, ``hostagent dra-plugin`` (unless
``dra_plugin`` is false) and ``hostagent node-controller`` (``start_controller``) as child
processes, and the test scheduler; plus NVIDIA's quickstart claims made into ResourceClaims
the way a pod's templates make them."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.waiting import until

from .agentd import make_root, running_agent
from .drakubelet import TestKubelet
from .drasched import Scheduler
from .kubeapi import TestApiServer

__all__ = ["Cluster", "DRIVER", "NODE", "quickstart", "running"]

DRIVER, NODE = "gpu.nvidia.com", "node-1"
DEMOS = Path(__file__).resolve().parents[1] / "data/dra/quickstart-claims.yaml"
# The plugin runs as root; run by another user here, it is that user, named one of the uids
# that may change the node for a claim (api.plugin_uids: MIG devices, a GPU passed through).
AGENT = {"api": {"watch_heartbeat": 2, "plugin_uids": [os.getuid()] if os.getuid() else []},
         "daemon": {"resync_interval": 0}, "health": {"quiet_period": None, "wait_timeout_ms": 200}}


def quickstart() -> dict[str, dict]:
    return {d["demo"]: d for d in yaml.safe_load(DEMOS.read_text())}


class Cluster:
    def __init__(self, profile: str = "dgx-a100", version=(1, 34), plugin_args=(), agent_config=None,
                 dra_plugin: bool = True, namespace: str = "hostagent"):
        self.root = make_root(profile)
        self._agent = contextlib.ExitStack()
        self.agent = self._agent.enter_context(running_agent(self.root, agent_config or AGENT, start=False))
        self.api = TestApiServer(version)
        self.work = Path(tempfile.mkdtemp(prefix="dra-"))
        self.kubelet = TestKubelet(self.work / "plugins_registry", self.api, NODE)
        self.scheduler = Scheduler(self.api)
        self.plugin_args = list(plugin_args)
        self.proc: subprocess.Popen | None = None
        self.log = self.work / "dra-plugin.log"
        self.dra_plugin = dra_plugin
        self.namespace = namespace
        self.controller: subprocess.Popen | None = None
        self.controller_log_path = self.work / "node-controller.log"
        self._claims = 0

    # ---- life -----------------------------------------------------------------------

    def start(self, api: bool = True) -> "Cluster":
        """The API server (unless ``api`` is false: started later, ``start_api``), the agent,
        the kubelet, the DRA plugin when it is one of the cluster's."""
        self.kubeconfig = self.api.kubeconfig(self.work / "kubeconfig")
        if api:
            self.start_api()
        self.agent.start()
        self.kubelet.start()
        if self.dra_plugin:
            self.start_plugin()
        return self

    def start_api(self) -> None:
        self.api.start()
        if NODE not in self.api.nodes:
            self.api.add_node(NODE)
        self.kubeconfig = self.api.kubeconfig(self.work / "kubeconfig")

    def start_controller(self, *args: str) -> subprocess.Popen:
        """``hostagent --simulate ROOT node-controller`` for the node, with ``args``."""
        cmd = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(self.root), "node-controller",
               "--kubeconfig", str(self.kubeconfig), "--node-name", NODE, "--namespace", self.namespace,
               "--log-level", "debug", *args]
        with open(self.controller_log_path, "ab") as log:
            self.controller = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        return self.controller

    def stop_controller(self) -> int:
        self.controller.send_signal(signal.SIGTERM)
        return self.controller.wait(15)

    def controller_log(self) -> str:
        path = self.controller_log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def start_plugin(self) -> None:
        cmd = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(self.root), "dra-plugin",
               "--kubeconfig", str(self.kubeconfig), "--node-name", NODE,
               "--plugin-registry", str(self.kubelet.registry), "--plugin-dir", str(self.work / "plugins" / DRIVER),
               "--resync", "2", "--log-level", "debug", *self.plugin_args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def stop_plugin(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def close(self) -> None:
        try:
            for proc in (self.proc, self.controller):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            self.kubelet.stop()
            self.api.stop()
        finally:
            self._agent.close()             # the agent stopped, its MPS daemons too, the node removed
            shutil.rmtree(self.work, ignore_errors=True)

    def plugin_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    # ---- the pool -------------------------------------------------------------------

    def devices(self) -> dict[str, dict]:
        """The published devices by name, once the pool is complete."""
        until(lambda: self.api.complete(DRIVER, NODE), timeout=15, what="a complete pool")
        return {d["name"]: d for s in self.api.pool(DRIVER, NODE) for d in s["spec"].get("devices") or []}

    # ---- claims -----------------------------------------------------------------------

    def claims(self, demo: dict, count: int | None = None) -> list[dict]:
        """The demo's ResourceClaims, as its pods make them (a template: one per pod)."""
        obj = demo["object"]
        out = []
        for _ in range(count or demo["claims"]):
            self._claims += 1
            meta = obj["metadata"]
            if obj["kind"] == "ResourceClaimTemplate":
                spec, name = copy.deepcopy(obj["spec"]["spec"]), f"pod{self._claims}-{meta['name']}"
            else:
                spec, name = copy.deepcopy(obj["spec"]), meta["name"]
            out.append(self.api.put_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                           "metadata": {"namespace": meta["namespace"], "name": name}, "spec": spec}))
        return out

    def claim_at(self, bdf: str, tolerations=None, name: str | None = None) -> dict:
        """A ``gpu.nvidia.com`` claim for exactly the GPU at PCI bus id ``bdf`` (its request
        tolerating ``tolerations``)."""
        expression = f"device.attributes['resource.kubernetes.io'].pciBusID == '{bdf}'"
        exactly = {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": expression}}],
                   **({"tolerations": tolerations} if tolerations else {})}
        self._claims += 1
        return self.api.put_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                   "metadata": {"namespace": "default",
                                                "name": name or f"at-{bdf.replace(':', '-')}-{self._claims}"},
                                   "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})

    def allocate(self, claims: list[dict]) -> list[dict]:
        return [self.scheduler.allocate(c, NODE) for c in claims]

    def forget(self, claims: list[dict]) -> None:
        """Unprepare (as the kubelet does when the pods are gone) and delete the claims."""
        if claims:
            errors = self.kubelet.unprepare(*claims)
            assert not any(errors.values()), errors
        for c in claims:
            self.api.delete_claim(c["metadata"]["namespace"], c["metadata"]["name"])

    def allocations(self) -> list[dict]:
        with self.agent.client() as c:
            return [a for a in c.allocations() if a["id"].startswith("k8s-dra/")]

    def cdi_devices(self) -> set[str]:
        """Every fully qualified CDI device name the specs in /etc/cdi and /var/run/cdi define."""
        names = set()
        for folder in ("etc/cdi", "var/run/cdi"):          # the folders CDI runtimes read
            for path in (self.root / folder).glob("*.*"):
                if path.suffix not in (".json", ".yaml"):
                    continue
                spec = yaml.safe_load(path.read_text())
                names |= {f"{spec['kind']}={d['name']}" for d in spec.get("devices") or []}
        return names


@contextlib.contextmanager
def running(cluster: Cluster, ready=lambda c: c.devices()):
    """``cluster`` started for the block, once its plugin registered and ``ready(cluster)``;
    the plugin's log printed when the block fails; closed after."""
    try:
        cluster.start()
        cluster.kubelet.plugin()
        ready(cluster)
        yield cluster
    except BaseException:
        print(cluster.plugin_log()[-6000:])
        raise
    finally:
        cluster.close()
