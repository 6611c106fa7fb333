"""Benchmark of the device plugin against the agent on a simulated DGX A100.

    python3 bench/device_plugin.py [--calls 1000] [--xids 20] [--baseline DIR]

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

--baseline DIR runs a second agent, plugin and kubelet on the hostagent package in DIR
(another checkout, e.g. ``git archive main hostagent | tar -x -C DIR``), and every
measurement alternates the two in four slices. The last lines are the goal's figures.
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


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


class Stack:
    """One agent, its device plugin and a test kubelet, running the hostagent package in
    ``package`` (a checkout's folder: first on the processes' path)."""

    def __init__(self, name: str, package: str):
        from tests.integration.agentd import AgentProcess, make_root
        from tests.integration.kubelet import TestKubelet
        self.name, self.package = name, package
        self.root = make_root()
        self.work = Path(tempfile.mkdtemp(prefix="dpb-"))
        env = {"PYTHONPATH": package}
        self.agent = AgentProcess(self.root, {"daemon": {"resync_interval": 0}, "health": {"quiet_period": None}},
                                  env=env)
        self.kubelet = TestKubelet(self.work / "device-plugins", self.work / "pod-resources/kubelet.sock")
        self.plugin = None
        self.client = None
        self.env = {**os.environ, **env}

    def start(self) -> "Stack":
        self.agent.start()
        self.kubelet.start()
        self.plugin = subprocess.Popen(
            [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(self.root), "device-plugin",
             "--plugin-dir", str(self.kubelet.dir), "--pod-resources-socket", "none", "--log-level", "warning"],
            stdin=subprocess.DEVNULL, env=self.env, cwd="/")
        self.endpoint = self.kubelet.endpoint(GPU, timeout=30)
        self.endpoint.wait(lambda l: len(l) == 8 and all(h == "Healthy" for _, h, _ in l))
        self.client = self.agent.client()
        self.gpus = [g["uuid"] for g in self.client.devices()["gpus"]]
        self.pids = {"agent": self.agent.proc.pid, "plugin": self.plugin.pid}
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.plugin is not None:
            self.plugin.send_signal(signal.SIGTERM)
            self.plugin.wait(15)
        self.kubelet.stop()
        self.agent.stop()
        self.agent.cleanup()
        shutil.rmtree(self.work, ignore_errors=True)


def alternated(stacks: list[Stack], calls: int, setup, call, teardown=None, rounds: int = 4) -> dict:
    """{stack name: (latencies, CPU ms per call of each process)}: ``call(stack, i)`` timed
    ``calls`` times per stack, in ``rounds`` slices that alternate the stacks."""
    out = {s.name: ([], {k: 0.0 for k in s.pids}) for s in stacks}
    for s in stacks:
        setup(s)
    per = max(1, calls // rounds)
    for r in range(rounds):
        for s in (stacks if r % 2 == 0 else stacks[::-1]):
            samples, cpu = out[s.name]
            before = {k: cpu_seconds(pid) for k, pid in s.pids.items()}
            base = len(samples)
            samples += timed(lambda i: call(s, base + i), per)
            for k, pid in s.pids.items():
                cpu[k] += cpu_seconds(pid) - before[k]
    for s in stacks:
        if teardown is not None:
            teardown(s)
        samples, cpu = out[s.name]
        out[s.name] = (samples, {k: v / len(samples) * 1e3 for k, v in cpu.items()})
    return out


def report(label: str, results: dict) -> None:
    for name, (samples, cpu) in results.items():
        used = ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        print(f"  {label:<28} {name:<9} {percentiles(samples)}\n      CPU ms per call: {used}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--xids", type=int, default=20)
    parser.add_argument("--baseline", metavar="DIR", help="also run the hostagent package in DIR (another "
                        "checkout), alternated with this one")
    args = parser.parse_args()
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())

    from hostagent.sim.control import inject_xid
    from hostagent.sim.store import SimStore

    os.chdir("/")               # python -m puts the working directory first on a process's path
    stacks = [Stack("current", str(REPO))]
    if args.baseline:
        stacks.append(Stack("baseline", args.baseline))
    try:
        for s in stacks:
            s.start()
        print(f"Allocate, {args.calls} calls each (simulated DGX A100, plugin and agent on this machine)")
        report("held set (idempotent)", alternated(
            stacks, args.calls, lambda s: s.kubelet.allocate(GPU, s.gpus[:2]),
            lambda s, i: s.kubelet.allocate(GPU, s.gpus[:2])))
        report("agent alone (idempotent)", alternated(
            stacks, args.calls, lambda s: s.client.allocate("bench-held", [s.gpus[6]]),
            lambda s, i: s.client.allocate("bench-held", [s.gpus[6]]), lambda s: s.client.release("bench-held")))
        new = alternated(stacks, args.calls, lambda s: None,
                         lambda s, i: s.kubelet.allocate(GPU, [s.gpus[:1], s.gpus[:2]][i % 2]))
        report("new set (release + create)", new)
        report("agent alone (create replacing the last, node names)", alternated(
            stacks, args.calls, lambda s: s.client.allocate("bench-r-1", [s.gpus[7]], cdi_names="node"),
            lambda s, i: s.client.allocate(f"bench-r{i}", [s.gpus[7]], cdi_names="node",
                                           replaces=[f"bench-r{i - 1}"]),
            lambda s: s.client.release(f"bench-r{args.calls // 4 * 4 - 1}")))
        for names in ("node", "allocation"):
            def agent_alone(s, i, names=names):
                s.client.allocate(f"bench-{i}", [s.gpus[7]], cdi_names=names)
                s.client.release(f"bench-{i}")
            report(f"agent alone (create+release, {names} names)", alternated(
                stacks, args.calls, lambda s: None, agent_alone))
        report("GetPreferredAllocation (4 of 8)", alternated(
            stacks, args.calls, lambda s: None, lambda s, i: s.kubelet.prefer(GPU, s.gpus, 4)))

        for s in stacks:
            store = SimStore(s.root)
            latencies = []
            for i in range(args.xids):
                index = i % 8
                start = time.perf_counter()
                inject_xid(store, index, 79)
                s.endpoint.wait(lambda l: l[index][1] == "Unhealthy", timeout=30)
                latencies.append(time.perf_counter() - start)
                s.client.clear_health([str(index)])
                s.endpoint.wait(lambda l: all(h == "Healthy" for _, h, _ in l), timeout=30)
            print(f"XID 79 -> ListAndWatch Unhealthy ({s.name}) {percentiles(latencies)}")
        print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
        print("the goal's figures, a new set through the plugin (goal: p50 at most 2.5 ms, p99 at most 5 ms):")
        for name, (samples, cpu) in new.items():
            print(f"  {name:<9} {percentiles(samples)}")
        return 0
    finally:
        for s in stacks:
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
