"""Benchmark of the device plugin against the agent on a simulated DGX A100.

    python3 bench/device_plugin.py [--calls 1000] [--xids 20]

A test kubelet (tests/integration/kubelet.py) registers the plugin (``hostagent
device-plugin`` in its own process) and calls it over gRPC as the kubelet does:

1. ``Allocate`` latency, p50/p99 over --calls calls (goal: p99 <= 5 ms), in three kinds
   measured in the same run:
   - *held set*: a device set the agent already holds an allocation for (a kubelet retry, an
     app container reusing its init container's devices): the agent answers idempotently;
     beside it, the same idempotent request to the agent alone through the Python client;
   - *new set*: a set overlapping the last one, so each call releases the allocation the
     kubelet handed out again and creates one, in one request (``replaces``) and one
     checkpoint write (fsynced);
   each with the agent's and the plugin's CPU time per call;
   - beside them, the agent alone through the Python client: the same create replacing the
     last (the floor of the second kind), and ``POST /v1/allocations`` plus ``DELETE`` with
     the node spec's names and with a transient spec of its own (two commits each).
2. ``GetPreferredAllocation`` latency (4 of 8 GPUs), p50/p99.
3. XID to ``ListAndWatch``: the time from injecting XID 79 on a GPU (through the simulated
   NVML's event API, as the driver would raise it) to the kubelet's stream carrying that
   GPU as Unhealthy, --xids times (the health monitor's default NVML wait of 1 s included).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPU = "nvidia.com/gpu"


def percentiles(samples: list[float]) -> str:
    s = sorted(samples)
    p = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1e3      # noqa: E731
    return f"p50 {p(0.50):6.2f} ms   p99 {p(0.99):6.2f} ms   max {s[-1] * 1e3:6.2f} ms   (n={len(s)})"


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_call(pids: dict[str, int], fn, n: int) -> tuple[list[float], str]:
    """``timed(fn, n)``, and each process's CPU time per call: steadier than latency on a
    shared machine, where the latency is also the others' load."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    samples = timed(fn, n)
    used = ", ".join(f"{name} {(cpu_seconds(pid) - before[name]) / n * 1e3:.2f}" for name, pid in pids.items())
    return samples, f"CPU ms per call: {used}"


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--xids", type=int, default=20)
    args = parser.parse_args()
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())

    from hostagent.sim.control import inject_xid
    from hostagent.sim.store import SimStore
    from tests.integration.agentd import AgentProcess, make_root
    from tests.integration.kubelet import TestKubelet

    root = make_root()
    work = Path(tempfile.mkdtemp(prefix="dpb-"))
    agent = AgentProcess(root, {"daemon": {"resync_interval": 0}, "health": {"quiet_period": None}})
    kubelet = TestKubelet(work / "device-plugins", work / "pod-resources/kubelet.sock")
    plugin = None
    try:
        agent.start()
        kubelet.start()
        plugin = subprocess.Popen(
            [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "device-plugin",
             "--plugin-dir", str(kubelet.dir), "--pod-resources-socket", "none", "--log-level", "warning"],
            stdin=subprocess.DEVNULL)
        endpoint = kubelet.endpoint(GPU, timeout=30)
        endpoint.wait(lambda l: len(l) == 8 and all(h == "Healthy" for _, h, _ in l))
        with agent.client() as c:
            gpus = [g["uuid"] for g in c.devices()["gpus"]]

            print(f"Allocate, {args.calls} calls each (simulated DGX A100, plugin and agent on this machine)")
            pids = {"agent": agent.proc.pid, "plugin": plugin.pid}
            kubelet.allocate(GPU, gpus[:2])
            held, cpu = cpu_per_call(pids, lambda i: kubelet.allocate(GPU, gpus[:2]), args.calls)
            print(f"  held set (idempotent)        {percentiles(held)}\n      {cpu}")
            c.allocate("bench-held", [gpus[6]])
            held_alone = timed(lambda i: c.allocate("bench-held", [gpus[6]]), args.calls)
            c.release("bench-held")
            print(f"  agent alone (idempotent)     {percentiles(held_alone)}")
            sets = [gpus[:1], gpus[:2]]          # each overlaps the one before
            new, cpu = cpu_per_call(pids, lambda i: kubelet.allocate(GPU, sets[i % 2]), args.calls)
            print(f"  new set (release + create)   {percentiles(new)}\n      {cpu}")

            c.allocate("bench-r-1", [gpus[7]], cdi_names="node")
            replacing = timed(lambda i: c.allocate(f"bench-r{i}", [gpus[7]], cdi_names="node",
                                                   replaces=[f"bench-r{i - 1}"]), args.calls)
            c.release(f"bench-r{args.calls - 1}")
            print(f"  agent alone (create replacing the last, node names) {percentiles(replacing)}")
            for names in ("node", "allocation"):
                def agent_alone(i):
                    c.allocate(f"bench-{i}", [gpus[7]], cdi_names=names)
                    c.release(f"bench-{i}")
                alone = timed(agent_alone, args.calls)
                print(f"  agent alone (create+release, {names} names) {percentiles(alone)}")

            prefer = timed(lambda i: kubelet.prefer(GPU, gpus, 4), args.calls)
            print(f"GetPreferredAllocation (4 of 8) {percentiles(prefer)}")

            store = SimStore(root)
            latencies = []
            for i in range(args.xids):
                index = i % 8
                start = time.perf_counter()
                inject_xid(store, index, 79)
                endpoint.wait(lambda l: l[index][1] == "Unhealthy", timeout=30)
                latencies.append(time.perf_counter() - start)
                c.clear_health([str(index)])
                endpoint.wait(lambda l: all(h == "Healthy" for _, h, _ in l), timeout=30)
            print(f"XID 79 -> ListAndWatch Unhealthy {percentiles(latencies)}")
        print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
        return 0
    finally:
        if plugin is not None:
            plugin.send_signal(signal.SIGTERM)
            plugin.wait(15)
        kubelet.stop()
        agent.stop()
        agent.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
