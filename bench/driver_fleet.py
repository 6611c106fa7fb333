"""Benchmark of a fleet driver upgrade through Kubernetes against ``driver install`` alone,
side by side in one run, on three simulated A30 nodes (Debian 12).

    python3 bench/driver_fleet.py [--rounds 3]

The cluster of the tests (tests/integration/fleet.py): the test API server, and per node the
real agent and ``hostagent node-controller`` in processes of their own. Each round, for
``maxParallelUpgrades`` 1 and then 3:

- *install alone*: the ConfigMap ``hostagent-driver`` deleted (the controllers then do
  nothing), ``hostagent driver install --version V`` run on each node, one after the other
  at 1 and all at once at 3, with its agent running (held in maintenance, as in a rollout);
  the time until the last one ends;
- *rollout*: the ConfigMap created with another version and that ``maxParallelUpgrades``;
  the time until every node is labelled ``upgrade-done`` (its agent verified the driver,
  and the controller refreshed the CDI spec and lifted its cordon).

Each install changes the version (550.127.05 and 570.86.15 in turn), in both. The time the
controller adds per node is (rollout - install alone) / 3 at 1, where the nodes go one
after the other, and (rollout - install alone) at 3, where they go at once: the API round
trips (labels, Events, the Lease), the cordon, the pod list, the install asked for through
the agent and followed on its socket, and the validation. The goal: at most 2 s.
Prints the machine's load with the figures.
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

VERSIONS = ("550.127.05", "570.86.15")


def wait(predicate, what: str, timeout: float = 300.0, interval: float = 0.01) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(interval)
    return time.perf_counter()


def install_alone(fleet, version: str, parallel: bool) -> float:
    """``driver install --version`` on every node (at once when ``parallel``): seconds."""
    start = time.perf_counter()
    procs = []
    for member in fleet.nodes.values():
        cmd = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(member.root), "driver", "install",
               "--version", version]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        procs.append(proc)
        if not parallel:
            _end(proc, version)
    for proc in procs if parallel else ():
        _end(proc, version)
    return time.perf_counter() - start


def _end(proc, version: str) -> None:
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"driver install {version} failed: {err.decode()[-500:]}")


def rollout(fleet, version: str, parallel: int) -> float:
    """The ConfigMap given ``version``: seconds until every node is upgrade-done."""
    since = fleet.revision()
    start = time.perf_counter()
    fleet.configmap(version=version, maxParallelUpgrades=parallel)

    def done() -> bool:
        walked = {n for _, n, state, _ in fleet.history(since) if state == "cordon-required"}
        return walked == set(fleet.nodes) and all(s == "upgrade-done" for s in fleet.states().values())
    return wait(done, f"every node at {version}") - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="each round's figures as it ends")
    args = parser.parse_args()
    from tests.integration.fleet import NAMESPACE, Fleet

    fleet = Fleet()
    times: dict[int, dict[str, list[float]]] = {1: {"alone": [], "rollout": []}, 3: {"alone": [], "rollout": []}}
    try:
        fleet.start()
        for _ in range(args.rounds):
            for parallel in (1, 3):
                if fleet.api.get("configmaps", "hostagent-driver", NAMESPACE) is not None:
                    fleet.api.delete("configmaps", "hostagent-driver", NAMESPACE)
                times[parallel]["alone"].append(install_alone(fleet, VERSIONS[0], parallel == 3))
                times[parallel]["rollout"].append(rollout(fleet, VERSIONS[1], parallel))
                if args.verbose:
                    print(f"  {parallel}: alone {times[parallel]['alone'][-1]:.2f} s, rollout "
                          f"{times[parallel]['rollout'][-1]:.2f} s", flush=True)
        load = os.getloadavg()
        print(f"3 simulated A30 nodes (Debian 12), {args.rounds} rounds each, medians, side by side:")
        for parallel, t in times.items():
            alone, by_rollout = statistics.median(t["alone"]), statistics.median(t["rollout"])
            per_node = (by_rollout - alone) / (3 if parallel == 1 else 1)
            how = "one after the other" if parallel == 1 else "all at once"
            print(f"  maxParallelUpgrades {parallel}: driver install alone ({how}) {alone:.2f} s, rollout "
                  f"{by_rollout:.2f} s: the controller adds {per_node:+.2f} s per node (goal: at most 2 s)")
        print(f"  machine load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
        return 0
    finally:
        fleet.close()


if __name__ == "__main__":
    sys.exit(main())
