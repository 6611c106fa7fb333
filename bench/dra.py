"""Benchmark of the DRA kubelet plugin against the agent on a simulated DGX A100.

    python3 bench/dra.py [--claims 300] [--mig-claims 8] [--xids 20]

A one-node test cluster (tests/integration/dracluster.py: the test API server, the real
agent, the test kubelet, ``hostagent dra-plugin`` in its own process and the test scheduler)
is driven as the kubelet drives a DRA plugin:

1. ``NodePrepareResources`` latency of a one-GPU claim (NVIDIA's gpu-test1 claim), p50/p99
   over --claims claims (goal: p99 <= 10 ms on a 2-core machine), each a fresh claim
   allocated by the scheduler beforehand and unprepared after; beside it the kubelet's retry
   of a prepared claim (the agent answers idempotently), and the plugin's and the agent's CPU
   time per prepare.
2. ``NodePrepareResources`` of a four-partition MIG claim (NVIDIA's gpu-test4 claim: 1g.5gb
   twice, 2g.10gb and 3g.20gb of one GPU) with --dynamic-mig on a 1.35 API server, the four
   MIG devices made at the placements the scheduler chose (goal: at most 2 s), and its
   ``NodeUnprepareResources`` (the four destroyed), --mig-claims times.
3. XID to ``NodeWatchResources``: the time from injecting XID 79 on a GPU (through the
   simulated NVML's event API, as the driver would raise it) to the kubelet's health stream
   carrying that GPU as UNHEALTHY, --xids times (goal: within 2 s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.device_plugin import cpu_seconds, percentiles  # noqa: E402


def prepare_latency(cluster, claims: int) -> None:
    from tests.integration.dracluster import quickstart
    demo = quickstart()["gpu-test1"]
    pids = {"plugin": cluster.proc.pid, "agent": cluster.agent.proc.pid}
    fresh, retry = [], []
    cpu = {name: 0.0 for name in pids}
    for _ in range(claims):
        [claim] = cluster.allocate(cluster.claims(demo, 1))
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        start = time.perf_counter()
        [(devices, error)] = cluster.kubelet.prepare(claim).values()
        fresh.append(time.perf_counter() - start)
        for name, pid in pids.items():
            cpu[name] += cpu_seconds(pid) - before[name]
        assert devices and not error, error
        start = time.perf_counter()
        cluster.kubelet.prepare(claim)
        retry.append(time.perf_counter() - start)
        cluster.forget([claim])
    print("NodePrepareResources, one GPU (gpu-test1's claim):")
    print(f"  new claim        {percentiles(fresh)}")
    print(f"  kubelet retry    {percentiles(retry)}")
    print("  CPU ms per new claim: " + ", ".join(f"{n} {v / claims * 1e3:.2f}" for n, v in cpu.items()))


def mig_latency(claims: int) -> None:
    from tests.integration.dracluster import Cluster, quickstart
    demo = quickstart()["gpu-test4"]
    modes = {"version": "v1", "mig-configs": {"modes": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]}}
    cluster = Cluster(version=(1, 35), plugin_args=["--dynamic-mig"])
    prepare, unprepare = [], []
    try:
        cluster.start()
        cluster.kubelet.plugin()
        with cluster.agent.client(timeout=None) as c:
            c.mig_apply("modes", spec=modes)
        from tests.waiting import until
        until(lambda: any("-mig-" in n for n in cluster.devices()), what="partitions published")
        for _ in range(claims):
            [claim] = cluster.allocate(cluster.claims(demo, 1))
            start = time.perf_counter()
            [(devices, error)] = cluster.kubelet.prepare(claim).values()
            prepare.append(time.perf_counter() - start)
            assert len(devices) == 4 and not error, error
            start = time.perf_counter()
            assert not any(cluster.kubelet.unprepare(claim).values())
            unprepare.append(time.perf_counter() - start)
            cluster.api.delete_claim(claim["metadata"]["namespace"], claim["metadata"]["name"])
    finally:
        cluster.close()
    print("NodePrepareResources, four MIG partitions made (gpu-test4's claim, --dynamic-mig):")
    print(f"  prepare          {percentiles(prepare)}")
    print(f"  unprepare        {percentiles(unprepare)}")


def xid_latency(cluster, xids: int) -> None:
    from hostagent.sim.control import inject_xid
    from hostagent.sim.store import SimStore
    p = cluster.kubelet.plugin()
    healthy = lambda entries: all(e[2] == "HEALTHY" for e in entries)          # noqa: E731
    samples = []
    for i in range(xids):
        gpu = i % 8
        p.wait_health(healthy)
        start = time.perf_counter()
        inject_xid(SimStore(cluster.root), gpu, 79)
        p.wait_health(lambda entries: not healthy(entries), timeout=30)
        samples.append(time.perf_counter() - start)
        with cluster.agent.client() as c:
            c.clear_health([str(gpu)])
    print("XID 79 to NodeWatchResources (UNHEALTHY):")
    print(f"  {percentiles(samples)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--mig-claims", type=int, default=8)
    parser.add_argument("--xids", type=int, default=20)
    args = parser.parse_args()
    from tests.integration.dracluster import Cluster
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    cluster = Cluster()
    try:
        cluster.start()
        cluster.kubelet.plugin()
        cluster.devices()
        prepare_latency(cluster, args.claims)
        xid_latency(cluster, args.xids)
    finally:
        cluster.close()
    mig_latency(args.mig_claims)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
