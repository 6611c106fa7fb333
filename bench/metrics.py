#!/usr/bin/env python3
"""Metrics cost on a simulated DGX A100 with every GPU split into seven 1g.5gb instances
(8 GPUs + 56 MIG devices), the health monitor running and a few devices allocated:

  NVML calls per sample interval    first sample (handle lookups, refusals learnt) and steady state
  sample duration                   one pass of the sampler thread over the node
  scrape latency                    Exporter.render() on a cached page, on a fresh snapshot,
                                    and a whole HTTP scrape over loopback
  idle CPU                          the process with monitor and sampler running, no scrapes

Figures from the simulator include its own costs (its NVML calls are Python; its event wait
polls the state file, every 200 ms once idle), so NVML-side numbers are upper bounds for a
real node.

    python3 bench/metrics.py [--scrapes 1000] [--idle 10] [--interval 10] [--daemon]

--daemon also runs the real daemon (hostagent serve) on the same kind of node and measures
``GET /metrics`` on its socket and the whole daemon's idle CPU (monitor, sampler and the
60 s inventory re-read), with the monitor on and off.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import urllib.request


def ms(values) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"median {statistics.median(values) * 1000:7.3f} ms   p99 {p99 * 1000:7.3f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=1000)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measurement")
    ap.add_argument("--interval", type=float, default=10.0, help="sample interval during the idle run")
    ap.add_argument("--daemon", action="store_true", help="also measure the real daemon")
    args = ap.parse_args()
    if args.daemon:
        for health in (True, False):
            daemon_figures(args, health)

    import pynvml
    from prometheus_client.parser import text_string_to_metric_families

    from hostagent.devices import read_inventory
    from hostagent.health import HealthMonitor, HealthOptions
    from hostagent.sim.platform import simulated_host
    from hostagent.metrics import AgentMetrics, MetricsOptions, MetricsService, allocation_labels
    from hostagent.sim.driverroot import create_node
    from hostagent.sim.node import MIG_ENABLE

    root = tempfile.mkdtemp(prefix="hostagent-bench-")
    try:
        store = create_node(root, "dgx-a100")
        with store.mutate() as s:
            for g in range(8):
                s.set_mig_mode(store.facts, g, MIG_ENABLE)
                s.reset_gpu(g)
                for _ in range(7):
                    gi = s.create_gi(store.facts, g, 19)
                    s.create_ci(store.facts, g, gi.id, 0)
        host = simulated_host(root)
        inv = read_inventory(host)
        assert len(inv.gpus) == 8 and len(inv.mig_devices) == 56
        owners = {d.uuid: [f"claim-{i}"] for i, d in enumerate(inv.mig_devices[::4])}
        agent = AgentMetrics()
        monitor = HealthMonitor(host, inv, HealthOptions(state_file=False), metrics=agent)
        service = MetricsService(host, inv, MetricsOptions(port=0, interval=3600, hostname="bench"),
                                 health_monitor=monitor, device_labels=allocation_labels(lambda: owners),
                                 agent=agent)
        lib = pynvml.nvmlLib
        monitor.start()
        service.start()                          # takes the first sample
        try:
            first = service.sampler.snapshot
            samples = [service.sampler.sample_now() for _ in range(20)]
            steady = samples[-1]
            body = service.render()
            families = list(text_string_to_metric_families(body.decode()))
            n_series = sum(len(f.samples) for f in families)

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
        shutil.rmtree(root, ignore_errors=True)

    print("node: 8x A100-SXM4-40GB, 56 MIG devices (1g.5gb), health monitor on, 14 devices allocated")
    print(f"page: {len(body)} bytes, {len(families)} families, {n_series} series")
    print(f"NVML calls per sample: first {first.nvml_calls}, steady {steady.nvml_calls}")
    print(f"sample duration:       {ms([s.duration_s for s in samples])}")
    print(f"render (cached page):  {ms(cached)}")
    print(f"render (new snapshot): {ms(fresh)}")
    print(f"HTTP scrape, loopback: {ms(http)}")
    print(f"NVML calls during {len(cached) + len(fresh) + len(http)} scrapes: {scrape_calls}")
    print(f"idle CPU (monitor + sampler every {args.interval:g}s, {args.idle:g}s): {idle_cpu * 100:.2f}% of one core")
    print(f"  of which the simulated NVML wait alone (bare nvmlEventSetWait_v2 loop): {floor * 100:.2f}%")
    print(f"  difference (hostagent itself, within noise of a few tenths): {(idle_cpu - floor) * 100:+.2f}%")
    return 0


def daemon_figures(args, health: bool) -> None:
    """The daemon on a simulated DGX A100 split into 56 1g.5gb devices, 14 allocated."""
    import json
    import os
    import signal
    import subprocess
    import sys
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
