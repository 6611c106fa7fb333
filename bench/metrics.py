#!/usr/bin/env python3
"""Metrics cost on a simulated HGX H100 with every GPU split into seven 1g.10gb instances
(8 GPUs + 56 MIG devices), 14 of them busy ('sim load') and held by pods the kubelet's pod
resources API reports, the health monitor running:

  NVML calls per sample interval    in steady state, of which GPM's (two a GPU instance: a
                                    sample and the metrics since the last one)
  sample pass                       one pass of the sampler over the node: wall and CPU time
  scrape latency                    Exporter.render() on a cached page, on a fresh snapshot,
                                    and a whole HTTP scrape over loopback, with pod labels
  idle CPU                          the process with monitor and sampler running, no scrapes

    python3 bench/metrics.py [--scrapes 1000] [--idle 10] [--interval 10] [--daemon]
                             [--baseline DIR ... [--rounds 60] [--own-work]]

--baseline DIR compares the sample pass side by side with the code in DIR (a checkout of
another version, e.g. ``git worktree add /tmp/main main``); given more than once, with each
of them. One process per tree, each with a node of the same layout, asked for a pass in
turn, so all see the same machine load; it prints the median of each and of the
pass-by-pass ratios, CPU (the pass's thread time, steadier on a busy machine) and wall.
The first baseline is the one the goal is measured against: the sample pass at most 1.5x
the CPU time of the code before profiling metrics (``git worktree add /tmp/before 4f01852``).
--own-work compares the passes again with the simulated library's device and GPM functions
returning at once: hostagent's own work, without the simulator's.

--daemon also runs the real daemon (hostagent serve) on a simulated DGX A100 and measures
``GET /metrics`` on its socket and the whole daemon's idle CPU (monitor, sampler and the
60 s inventory re-read), with the monitor on and off.

Figures from the simulator include its own costs (its NVML calls are Python; its event wait
polls the state file, every 200 ms once idle), so NVML-side numbers are upper bounds for a
real node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

BUSY = 14               # MIG devices with a load and a pod


def ms(values) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"median {statistics.median(values) * 1000:7.3f} ms   p99 {p99 * 1000:7.3f} ms"


def make_node(root: str):
    """The benchmark's node in ``root``: 8 H100s split into 56 1g.10gb devices, BUSY of them
    loaded (when the simulator has workloads). Returns (host, inventory). Run by the
    baseline's process too, so it uses only what older versions have."""
    from hostagent.devices import read_inventory
    from hostagent.sim.driverroot import create_node
    from hostagent.sim.node import MIG_ENABLE
    store = create_node(root, "hgx-h100")
    with store.mutate() as s:
        for g in range(8):
            s.set_mig_mode(store.facts, g, MIG_ENABLE)
            s.reset_gpu(g)
            for _ in range(7):
                gi = s.create_gi(store.facts, g, 19)
                s.create_ci(store.facts, g, gi.id, 0)
    try:
        from hostagent.sim import workload
    except ImportError:
        pass
    else:
        for i in range(BUSY):
            workload.set_load(store, f"{i // 7}:{i % 7}",
                              workload.Load(gr=60, sm=50, occupancy=20, tensor=30, dram=25, pcie_rx=200))
    try:
        from hostagent.sim.platform import simulated_host
    except ImportError:                  # before the simulator's platform seam
        from hostagent.hostroot import HostRoot
        simulated_host = HostRoot.simulation
    host = simulated_host(root)
    inv = read_inventory(host)
    assert len(inv.gpus) == 8 and len(inv.mig_devices) == 56
    return host, inv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=1000)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measurement")
    ap.add_argument("--interval", type=float, default=10.0, help="sample interval during the idle run")
    ap.add_argument("--daemon", action="store_true", help="also measure the real daemon")
    ap.add_argument("--baseline", metavar="DIR", action="append",
                    help="compare the sample pass with the code in DIR (repeatable; the first is the goal's)")
    ap.add_argument("--rounds", type=int, default=60, help="passes per tree with --baseline")
    ap.add_argument("--own-work", action="store_true",
                    help="with --baseline, compare also the passes with the simulated NVML answering at once")
    args = ap.parse_args()
    if args.daemon:
        for health in (True, False):
            daemon_figures(args, health)
    if args.baseline:
        side_by_side(args.baseline, args.rounds)
        if args.own_work:
            side_by_side(args.baseline, args.rounds, own=True)

    import pynvml
    from prometheus_client.parser import text_string_to_metric_families

    from hostagent.health import HealthMonitor, HealthOptions
    from hostagent.metrics import AgentMetrics, MetricsOptions, MetricsService, allocation_labels

    root = tempfile.mkdtemp(prefix="hostagent-bench-")
    kubelet = None
    try:
        host, inv = make_node(root)
        busy = inv.mig_devices[:BUSY]
        owners = {d.uuid: [f"claim-{i}"] for i, d in enumerate(busy)}
        kubelet = pod_resources_server(host.host("/var/lib/kubelet/pod-resources/kubelet.sock"),
                               [(f"job-{i}", "ml", "main", d.uuid) for i, d in enumerate(busy)])
        agent = AgentMetrics()
        monitor = HealthMonitor(host, inv, HealthOptions(state_file=False), metrics=agent)
        service = MetricsService(host, inv, MetricsOptions(port=0, interval=3600, hostname="bench", kubernetes=True),
                                 health_monitor=monitor, device_labels=allocation_labels(lambda: owners),
                                 agent=agent)
        lib = pynvml.nvmlLib
        monitor.start()
        service.start()                          # takes the first sample (and its second, for the rates)
        try:
            service.pods.refresh()
            samples, cpu = [], []
            for _ in range(20):
                time.sleep(0.12)                 # GPM samples 100 ms apart at least
                c0 = time.thread_time()
                samples.append(service.sampler.sample_now())
                cpu.append(time.thread_time() - c0)
            steady = samples[-1]
            body = service.render()
            families = list(text_string_to_metric_families(body.decode()))
            n_series = sum(len(f.samples) for f in families)
            with_pods = sum(1 for f in families for x in f.samples if "pod" in x.labels)
            gpm_calls = service.sampler._reader._gpm.calls

            cached = []
            for _ in range(args.scrapes):
                t0 = time.perf_counter()
                service.render()
                cached.append(time.perf_counter() - t0)
            fresh = []
            for _ in range(50):
                service.sampler._snapshot = service.sampler.snapshot.__class__(   # same data, new identity
                    **{f: getattr(steady, f) for f in steady.__dataclass_fields__})
                t0 = time.perf_counter()
                service.render()
                fresh.append(time.perf_counter() - t0)
            calls_before = sum(lib.calls.values()) - lib.calls["nvmlEventSetWait_v2"]
            url = f"http://127.0.0.1:{service.port}/metrics"
            http = []
            for _ in range(min(args.scrapes, 300)):
                t0 = time.perf_counter()
                with urllib.request.urlopen(url) as r:
                    r.read()
                http.append(time.perf_counter() - t0)
            scrape_calls = sum(lib.calls.values()) - lib.calls["nvmlEventSetWait_v2"] - calls_before
        finally:
            service.stop()

        # idle: monitor waiting on events, sampler on its real interval, nobody scraping
        service = MetricsService(host, inv, MetricsOptions(port=None, interval=args.interval),
                                 health_monitor=monitor, agent=agent)
        service.start()
        try:
            c0, t0 = time.process_time(), time.monotonic()
            time.sleep(args.idle)
            idle_cpu = (time.process_time() - c0) / (time.monotonic() - t0)
        finally:
            service.stop()
            monitor.stop()
        floor = sim_wait_floor(host, args.idle)
    finally:
        if kubelet is not None:
            kubelet.stop(0).wait()
        shutil.rmtree(root, ignore_errors=True)

    print(f"node: 8x H100-SXM5-80GB, 56 MIG devices (1g.10gb), {BUSY} busy and held by pods, health monitor on")
    print(f"page: {len(body)} bytes, {len(families)} families, {n_series} series ({with_pods} with pod labels)")
    print(f"NVML calls per sample: {steady.nvml_calls} (GPM {gpm_calls})")
    print(f"sample pass, wall:     {ms([s.duration_s for s in samples])}")
    print(f"sample pass, CPU:      {ms(cpu)}")
    print(f"render (cached page):  {ms(cached)}")
    print(f"render (new snapshot): {ms(fresh)}")
    print(f"HTTP scrape, loopback: {ms(http)}")
    print(f"NVML calls during {len(cached) + len(fresh) + len(http)} scrapes: {scrape_calls}")
    print(f"idle CPU (monitor + sampler every {args.interval:g}s, {args.idle:g}s): {idle_cpu * 100:.2f}% of one core")
    print(f"  of which the simulated NVML wait alone (bare nvmlEventSetWait_v2 loop): {floor * 100:.2f}%")
    print(f"  difference (hostagent itself, within noise of a few tenths): {(idle_cpu - floor) * 100:+.2f}%")
    return 0


def pod_resources_server(socket, pods):
    """A pod resources server answering List with ``pods``: (pod, namespace, container, device id)."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from hostagent.plugins.kubelet import podresources_pb2 as pr
    from hostagent.plugins.kubelet import podresources_pb2_grpc as pr_grpc

    class Lister(pr_grpc.PodResourcesListerServicer):
        def List(self, request, context):
            reply = pr.ListPodResourcesResponse()
            for pod, ns, container, device in pods:
                c = reply.pod_resources.add(name=pod, namespace=ns).containers.add(name=container)
                c.devices.add(resource_name="nvidia.com/mig-1g.10gb", device_ids=[device])
            return reply
    socket.parent.mkdir(parents=True, exist_ok=True)
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    pr_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    return server


# One process per tree: its own node, a pass whenever asked. The editable install's import
# hook is dropped so that the tree on sys.path is the one imported.
WORKER = r"""
import ctypes, json, shutil, sys, tempfile, time
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
import pynvml
import hostagent
from metrics import make_node
from hostagent.devices import nvml_session
from hostagent.devices.samples import SampleReader


def answer_at_once(lib):
    # The simulated library's device and GPM queries return success at once: what a pass
    # then costs is hostagent's own work (and ctypes' calls into the library).
    for name, function in list(lib._funcs.items()):
        if name.startswith(("nvmlDeviceGet", "nvmlGpm")):
            setattr(lib, name, ctypes.CFUNCTYPE(ctypes.c_int, *function.argtypes)(lambda *args: 0))
    pynvml._nvmlGetFunctionPointer_cache.clear()


root = tempfile.mkdtemp(prefix="hostagent-bench-")
try:
    host, inv = make_node(root)
    with nvml_session(host):
        reader = SampleReader(inv)
        print(json.dumps(hostagent.__file__), flush=True)
        for i, _ in enumerate(sys.stdin):
            if i == 5 and sys.argv[3] == "own":
                answer_at_once(pynvml.nvmlLib)
            c0 = time.thread_time()
            s = reader.read()
            print(json.dumps([time.thread_time() - c0, s.duration_s, s.nvml_calls]), flush=True)
finally:
    shutil.rmtree(root, ignore_errors=True)
"""


GOAL = 1.5             # the sample pass's CPU time against the code before profiling metrics


def side_by_side(baselines: list[str], rounds: int, own: bool = False) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {os.path.abspath(b): os.path.abspath(b) for b in baselines}
    trees["this tree"] = here
    procs = {}
    for name, tree in trees.items():
        p = subprocess.Popen([sys.executable, "-c", WORKER, tree, os.path.dirname(os.path.abspath(__file__)),
                              "own" if own else "all"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        imported = json.loads(p.stdout.readline())
        assert imported.startswith(tree), f"{name}: imported {imported}, not {tree}"
        procs[name] = p
    got = {name: [] for name in procs}
    load = os.getloadavg()[0]
    try:
        for i in range(rounds + 5):
            time.sleep(0.15)                 # GPM samples 100 ms apart at least
            for name, p in procs.items():
                p.stdin.write("\n")
                p.stdin.flush()
                reply = json.loads(p.stdout.readline())
                if i >= 5:                   # first passes learn refusals, take handles
                    got[name].append(reply)
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(30)
    what = "hostagent's own work in the sample pass (the simulated NVML answering at once)" if own else "sample pass"
    print(f"{what} side by side, {rounds} passes each, in turn "
          f"(load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end):")
    for name, rows in got.items():
        print(f"  {name:24}  CPU median {statistics.median(r[0] for r in rows) * 1000:6.2f} ms   "
              f"wall median {statistics.median(r[1] for r in rows) * 1000:6.2f} ms   NVML calls {rows[-1][2]}")
    this = got["this tree"]
    for i, base_name in enumerate(trees):
        if base_name == "this tree":
            continue
        base = got[base_name]
        for what, k in (("CPU", 0), ("wall", 1)):
            ratios = [b[k] / a[k] for a, b in zip(base, this)]
            print(f"  this tree / {base_name}, {what}: median of pass ratios {statistics.median(ratios):.2f}, "
                  f"ratio of medians {statistics.median(b[k] for b in this) / statistics.median(a[k] for a in base):.2f}")
        if i == 0 and not own:
            ratio = statistics.median(b[0] / a[0] for a, b in zip(base, this))
            print(f"  goal, the sample pass's CPU time at most {GOAL}x the first baseline's: {ratio:.2f}x, "
                  f"{'met' if ratio <= GOAL else 'NOT met'}")


def daemon_figures(args, health: bool) -> None:
    """The daemon on a simulated DGX A100 split into 56 1g.5gb devices, 14 allocated."""
    import signal
    from pathlib import Path

    import psutil

    from hostagent.client import Client, DaemonNotRunning
    from hostagent.errors import UnavailableError
    from hostagent.sim.driverroot import create_node
    root = Path(tempfile.mkdtemp(prefix="hostagent-bench-"))
    try:
        create_node(root, "dgx-a100")
        config = root / "etc/hostagent/config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({"health": {"enabled": health},
                                      "metrics": {"port": None, "interval": args.interval}}))
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        proc = subprocess.Popen([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "serve",
                                 "--config", str(config), "--log-level", "warning"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = Client(socket_path=root / "run/hostagent/hostagent.sock")
            for _ in range(400):
                try:
                    client.node()
                    break
                except (DaemonNotRunning, UnavailableError):
                    time.sleep(0.05)
            spec = {"version": "v1", "mig-configs": {"s": [
                {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]}}
            client.request("POST", "/v1/mig/apply", {"config": "s", "spec": spec})
            for i in range(14):
                client.allocate(f"claim-{i}", [f"{i // 7}:{i % 7}"])
            body = client.request("GET", "/metrics").body
            times = []
            for _ in range(min(args.scrapes, 500)):
                t0 = time.perf_counter()
                client.request("GET", "/metrics")
                times.append(time.perf_counter() - t0)
            client.close()
            p = psutil.Process(proc.pid)
            time.sleep(2.0)
            c0, t0 = sum(p.cpu_times()[:2]), time.monotonic()
            time.sleep(args.idle)
            cpu = (sum(p.cpu_times()[:2]) - c0) / (time.monotonic() - t0)
            rss = p.memory_info().rss / 2 ** 20
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    what = "monitor on" if health else "monitor off"
    print(f"daemon ({what}), 56 MIG devices, 14 allocated:")
    print(f"  socket GET /metrics ({len(body)} bytes): {ms(times)}")
    print(f"  idle CPU over {args.idle:g}s: {cpu * 100:.2f}% of one core, RSS {rss:.0f} MB")


def sim_wait_floor(host, seconds: float) -> float:
    """CPU of waiting on the simulated event set with no hostagent code around it: the
    simulator polls its state file, where a real driver blocks in the kernel."""
    import pynvml as N
    from hostagent.devices import nvml_session
    with nvml_session(host):
        es = N.nvmlEventSetCreate()
        for i in range(N.nvmlDeviceGetCount()):
            N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(i), N.nvmlEventTypeXidCriticalError, es)
        c0, t0 = time.process_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            try:
                N.nvmlEventSetWait_v2(es, 1000)
            except N.NVMLError_Timeout:
                pass
        cpu = (time.process_time() - c0) / (time.monotonic() - t0)
        N.nvmlEventSetFree(es)
    return cpu


if __name__ == "__main__":
    raise SystemExit(main())
