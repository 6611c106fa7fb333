"""Benchmark of the node controller's MIG by label against the agent's own MIG apply, side by
side in one run, on a simulated DGX A100 (8x A100-SXM4-40GB).

    python3 bench/node_controller.py [--rounds 5]

One node: the test API server (tests/integration/kubeapi.py), the real agent, ``hostagent
device-plugin --mig-strategy single`` registered with the test kubelet, and ``hostagent
node-controller`` in its own process. Each round, from ``all-disabled``:

- *controller*: the node label ``nvidia.com/mig.config=all-1g.5gb`` set on the API server;
  the time to ``nvidia.com/mig.config.state=success`` on the Node, and to the device
  plugin's ListAndWatch listing the 56 MIG devices;
- *agent alone*: the same change as ``POST /v1/mig/apply`` (the label removed first, so
  the controller stays out of it); the time to its answer, and to the same list.

The goal: the controller adds at most 1 s to the agent's own apply (medians, side by side).
Needs root (NVML changes MIG modes for root only). Prints the machine's load with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MIG, STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
GPU = "nvidia.com/gpu"
AGENT = {"api": {"watch_heartbeat": 2}, "daemon": {"resync_interval": 0},
         "health": {"quiet_period": None, "wait_timeout_ms": 200}}


def wait(predicate, timeout: float = 60.0, interval: float = 0.002):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {predicate.__doc__ or predicate}")
        time.sleep(interval)
    return time.perf_counter()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/node_controller.py needs root: NVML changes MIG modes for root only", file=sys.stderr)
        return 2
    from tests.integration.dracluster import NODE, Cluster
    from tests.integration.kubelet import TestKubelet

    cluster = Cluster(dra_plugin=False, agent_config=AGENT)
    kubelet = plugin = None
    try:
        cluster.start()
        kubelet = TestKubelet(cluster.work / "device-plugins").start()
        plugin = subprocess.Popen(
            [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(cluster.root), "device-plugin",
             "--plugin-dir", str(kubelet.dir), "--pod-resources-socket", "none", "--mig-strategy", "single",
             "--log-level", "warning"], stdin=subprocess.DEVNULL)
        endpoint = kubelet.endpoint(GPU, timeout=60)
        cluster.start_controller("--log-level", "warning")
        api = cluster.api

        def state():
            return (api.get("nodes", NODE)["metadata"].get("labels") or {}).get(STATE)

        def listed(n):
            def check():
                return bool(endpoint.lists) and len(endpoint.lists[-1]) == n
            check.__doc__ = f"the device plugin listing {n} devices"
            return check

        controller, alone = {"state": [], "list": []}, {"apply": [], "list": []}
        with cluster.agent.client(timeout=None) as agent:
            for _ in range(args.rounds):
                # The controller's round, from all-disabled.
                api.label_node(NODE, {MIG: "all-disabled"})
                wait(lambda: state() == "success" and listed(8)())
                api.label_node(NODE, {STATE: None})
                start = time.perf_counter()
                api.label_node(NODE, {MIG: "all-1g.5gb"})
                controller["state"].append(wait(lambda: state() == "success") - start)
                controller["list"].append(wait(listed(56)) - start)
                # The agent alone, the label gone (the controller then changes nothing).
                api.label_node(NODE, {MIG: None, STATE: None})
                agent.mig_apply("all-disabled")
                wait(listed(8))
                start = time.perf_counter()
                agent.mig_apply("all-1g.5gb")
                alone["apply"].append(time.perf_counter() - start)
                alone["list"].append(wait(listed(56)) - start)
                agent.mig_apply("all-disabled")
                wait(listed(8))
        med = {k: statistics.median(v) for k, v in {**{f"c_{k}": v for k, v in controller.items()},
                                                     **{f"a_{k}": v for k, v in alone.items()}}.items()}
        print(f"MIG all-disabled -> all-1g.5gb on a simulated DGX A100, {args.rounds} rounds (medians):")
        print(f"  agent alone:  apply answered {med['a_apply']:.3f} s, ListAndWatch with 56 devices "
              f"{med['a_list']:.3f} s")
        print(f"  by label:     state=success {med['c_state']:.3f} s, ListAndWatch with 56 devices "
              f"{med['c_list']:.3f} s")
        print(f"  the controller adds {med['c_state'] - med['a_apply']:+.3f} s to state=success "
              f"and {med['c_list'] - med['a_list']:+.3f} s to the list (goal: at most 1 s)")
        print(f"  machine load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
              f"on {os.cpu_count()} cores")
        return 0
    finally:
        if plugin is not None:
            plugin.terminate()
            plugin.wait(15)
        if kubelet is not None:
            kubelet.stop()
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
