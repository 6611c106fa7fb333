"""Benchmark of the agent's local API on a simulated DGX A100.

    python3 bench/api.py [--duration 3] [--rounds32 5] [--idle-seconds 60] [--watchers 100]
                         [--baseline DIR]

1. Throughput and p50/p99 latency of GET /v1/devices with 1, 8 and 32 concurrent
   keep-alive clients, against the real daemon and, in the same run, against a trivial
   asyncio HTTP server on the same kind of UNIX socket answering a body of the same size
   (the floor any Python server pays; the difference is the agent's own cost). At 32
   clients, --rounds32 rounds alternate the servers (with --baseline DIR, also a second
   daemon running the hostagent package in DIR, another checkout), and the goal's figures
   are the medians: the agent's requests/s as a share of the trivial server's in the same
   round (goal: at least 80%), and its p99 (goal: at most 5 ms).
2. Watch delivery latency: WATCHERS open watch streams; an allocation is made; the time
   from sending it to each watcher receiving its event (target < 100 ms).
3. Allocation cost as allocations pile up: --allocations time-slicing allocations spread
   over the 8 GPUs (256 by default: the default allocations.max_per_device of 32 on each),
   the median time of the first and the last 50, and the checkpoint's size.
4. The daemon's RSS idle after start and after all the load above (goal: at most 60 MB),
   and its idle CPU over --idle-seconds (target < 1%).

Clients run in two processes (asyncio, raw non-blocking sockets) so the load generator is
not the bottleneck more than it must be on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REQUEST = b"GET /v1/devices HTTP/1.1\r\nHost: bench\r\n\r\n"


# ---- the trivial server ------------------------------------------------------------

TRIVIAL = r'''
import asyncio, sys
path, size = sys.argv[1], int(sys.argv[2])
body = b"x" * (size - 1) + b"\n"
response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % size) + body

class P(asyncio.Protocol):
    def connection_made(self, t):
        self.t, self.buf = t, b""
    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.buf = self.buf[end + 4:]
            self.t.write(response)

async def main():
    server = await asyncio.get_running_loop().create_unix_server(P, path)
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
'''


# ---- load generation ---------------------------------------------------------------

async def _one_client(path: str, deadline: float, warmup_until: float, latencies: list) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await loop.sock_connect(sock, path)
    try:
        while True:
            start = time.perf_counter()
            if start >= deadline:
                return
            await loop.sock_sendall(sock, REQUEST)
            buf = b""
            while True:
                chunk = await loop.sock_recv(sock, 262144)
                if not chunk:
                    raise ConnectionError("server closed")
                buf += chunk
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    continue
                i = buf.find(b"Content-Length: ", 0, end)
                length = int(buf[i + 16:buf.find(b"\r\n", i)])
                if len(buf) >= end + 4 + length:
                    break
            if start >= warmup_until:
                latencies.append(time.perf_counter() - start)
    finally:
        sock.close()


def _client_process(path: str, clients: int, start_at: float, warmup: float, duration: float, out) -> None:
    async def run():
        latencies: list[float] = []
        while time.time() < start_at:
            await asyncio.sleep(0.001)
        now = time.perf_counter()
        await asyncio.gather(*(_one_client(path, now + warmup + duration, now + warmup, latencies)
                               for _ in range(clients)))
        return latencies
    out.put(asyncio.run(run()))


def load(path: str, clients: int, duration: float, warmup: float = 0.5) -> dict:
    processes = 2 if clients > 1 else 1
    queue = mp.Queue()
    start_at = time.time() + 0.3
    procs = []
    for i in range(processes):
        share = clients // processes + (1 if i < clients % processes else 0)
        procs.append(mp.Process(target=_client_process, args=(path, share, start_at, warmup, duration, queue)))
    for p in procs:
        p.start()
    latencies = []
    for _ in procs:
        latencies += queue.get()
    for p in procs:
        p.join()
    latencies.sort()
    n = len(latencies)
    return {"clients": clients, "requests": n, "rps": n / duration,
            "p50_ms": latencies[n // 2] * 1000, "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000}


# ---- watch delivery ----------------------------------------------------------------

async def _watch_latency(path: str, watchers: int, rounds: int) -> tuple[list[float], list[float]]:
    """(from sending the change to each watcher's event, from the agent publishing the
    event to each watcher's receiving it: the watch's own part)."""
    from hostagent.client import Client
    loop = asyncio.get_running_loop()
    streams = []
    for _ in range(watchers):
        r, w = await asyncio.open_unix_connection(path, limit=1 << 24)
        w.write(b"GET /v1/watch HTTP/1.1\r\nHost: bench\r\n\r\n")
        await r.readuntil(b"\r\n\r\n")
        streams.append((r, w))

    async def next_event(r):
        size = int((await r.readuntil(b"\r\n")).strip(), 16)
        data = await r.readexactly(size + 2)
        return [json.loads(line) for line in data[:-2].splitlines() if line]

    for r, _ in streams:
        await next_event(r)                                   # the snapshot
    client = Client(socket_path=path)
    delays: list[float] = []
    fanout: list[float] = []
    for i in range(rounds):
        async def wait_for_created(r):
            while True:
                for e in await next_event(r):
                    if e["type"] == "allocation_created":
                        fanout.append(time.time() - e["time"])
                        return time.perf_counter()
        waiting = [asyncio.ensure_future(wait_for_created(r)) for r, _ in streams]
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        await loop.run_in_executor(None, client.allocate, f"bench-{i}", [str(i % 8)])
        arrivals = await asyncio.gather(*waiting)
        delays += [a - start for a in arrivals]
        await loop.run_in_executor(None, client.release, f"bench-{i}")
    client.close()
    for _, w in streams:
        w.close()
    return delays, fanout


# ---- process figures ---------------------------------------------------------------

def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- the run -----------------------------------------------------------------------

def start_daemon(root: Path, config: dict, package: str | None = None) -> subprocess.Popen:
    from hostagent.client import Client, DaemonNotRunning
    from hostagent.errors import UnavailableError
    cfg = root / "etc/hostagent/config.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM")}
    if package:                         # another checkout's hostagent package first on the path
        env["PYTHONPATH"] = package
    # python -m puts its working directory first on the path: the package's own checkout.
    proc = subprocess.Popen([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "serve",
                             "--config", str(cfg), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=package or REPO)
    sock = root / "run/hostagent/hostagent.sock"
    for _ in range(400):
        try:
            with Client(socket_path=sock) as c:
                c.node()
            return proc
        except (DaemonNotRunning, UnavailableError):
            time.sleep(0.05)
    raise SystemExit("the daemon did not start")


def allocation_cost(root: Path, sock: str, count: int) -> None:
    """Each allocation writes its spec and rewrites the checkpoint (both fsynced): how its
    cost grows with the number of allocations already made."""
    from hostagent.client import Client
    times = []
    with Client(socket_path=sock) as c:
        for i in range(count):
            t = time.perf_counter()
            c.allocate(f"cost-{i}", [str(i % 8)], sharing={"strategy": "TimeSlicing"})
            times.append(time.perf_counter() - t)
        state = root / "var/lib/hostagent"
        size = sum((state / name).stat().st_size for name in ("allocations.json", "allocations.journal")
                   if (state / name).exists())
        for i in range(count):
            c.release(f"cost-{i}")
    n = min(50, count)
    print(f"{count} time-slicing allocations over 8 GPUs: median {statistics.median(times[:n]) * 1000:.1f} ms "
          f"for the first {n}, {statistics.median(times[-n:]) * 1000:.1f} ms for the last {n}; "
          f"checkpoint and its journal {size / 1024:.0f} KB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per load level (default 3)")
    ap.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window (default 60)")
    ap.add_argument("--watchers", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="changes watched (default 5)")
    ap.add_argument("--allocations", type=int, default=256,
                    help="shared allocations made for the cost figures (default 256; 0: none)")
    ap.add_argument("--rounds32", type=int, default=5, help="alternated rounds at 32 clients (default 5)")
    ap.add_argument("--baseline", metavar="DIR", help="also run a daemon of the hostagent package in DIR")
    args = ap.parse_args()

    from hostagent.sim.driverroot import create_node
    root = Path(tempfile.mkdtemp(prefix="hostagent-bench-"))
    create_node(root, "dgx-a100")
    sock = str(root / "run/hostagent/hostagent.sock")
    limits = {"max_per_device": max(32, -(-args.allocations // 8)), "max_total": max(1024, args.allocations)}
    daemon = start_daemon(root, {"daemon": {"resync_interval": 60}, "allocations": limits})
    trivial_sock = str(root / "trivial.sock")
    trivial = baseline = None
    baseline_root = None
    try:
        if args.baseline:
            baseline_root = Path(tempfile.mkdtemp(prefix="hostagent-bench-baseline-"))
            create_node(baseline_root, "dgx-a100")
            baseline = start_daemon(baseline_root, {"daemon": {"resync_interval": 60}}, args.baseline)
        time.sleep(1.0)
        rss_start = rss_mb(daemon.pid)
        from hostagent.client import Client
        with Client(socket_path=sock) as c:
            body = len(c.request("GET", "/v1/devices").body)
        trivial = subprocess.Popen([sys.executable, "-c", TRIVIAL, trivial_sock, str(body)],
                                   stdout=subprocess.PIPE, text=True)
        assert trivial.stdout.readline().strip() == "ready"

        print(f"GET /v1/devices on a simulated DGX A100 ({body} byte body), {args.duration:.0f} s per level, "
              f"{os.cpu_count()} cores")
        print(f"{'server':<10} {'clients':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        servers = [("agent", sock), ("trivial", trivial_sock)]
        if baseline is not None:
            servers.insert(1, ("baseline", str(baseline_root / "run/hostagent/hostagent.sock")))
        for clients in (1, 8):
            for name, path in servers:
                r = load(path, clients, args.duration)
                print(f"{name:<10} {clients:>7} {r['rps']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}")
        rounds = []
        for i in range(args.rounds32):
            order = servers[i % len(servers):] + servers[:i % len(servers)]
            results = {name: load(path, 32, args.duration) for name, path in order}
            rounds.append(results)
            for name, _ in servers:
                r = results[name]
                print(f"{name:<10} {32:>7} {r['rps']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}   round {i + 1}")
        print(f"the goal's figures at 32 clients, medians of {args.rounds32} alternated rounds "
              f"(load average {os.getloadavg()[0]:.2f}):")
        for name, _ in servers[:-1]:
            share = statistics.median(r[name]["rps"] / r["trivial"]["rps"] for r in rounds)
            p99 = statistics.median(r[name]["p99_ms"] for r in rounds)
            rps = statistics.median(r[name]["rps"] for r in rounds)
            print(f"  {name}: {rps:.0f} req/s, {share * 100:.0f}% of the trivial server's (goal: at least 80%), "
                  f"p99 {p99:.2f} ms (goal: at most 5 ms)")

        delays, fanout = asyncio.run(_watch_latency(sock, args.watchers, args.rounds))
        delays.sort()
        fanout.sort()
        print(f"watch delivery to {args.watchers} watchers over {args.rounds} changes (target < 100 ms):")
        print(f"  from the request making the change: p50 {statistics.median(delays) * 1000:.1f} ms, "
              f"max {delays[-1] * 1000:.1f} ms (includes writing the spec and checkpoint, fsynced)")
        print(f"  from the event's publication:       p50 {statistics.median(fanout) * 1000:.1f} ms, "
              f"max {fanout[-1] * 1000:.1f} ms")

        if args.allocations:
            allocation_cost(root, sock, args.allocations)

        rss_after = rss_mb(daemon.pid)
        time.sleep(2.0)
        before = cpu_seconds(daemon.pid)
        t0 = time.monotonic()
        time.sleep(args.idle_seconds)
        cpu = (cpu_seconds(daemon.pid) - before) / (time.monotonic() - t0) * 100
        print(f"daemon RSS: {rss_start:.1f} MB idle after start, {rss_after:.1f} MB after the load "
              f"(goal: at most 60 MB)")
        print(f"daemon idle CPU over {args.idle_seconds:.0f} s: {cpu:.3f}% (target < 1%; includes the "
              f"inventory re-read every 60 s)")
    finally:
        for p in (daemon, trivial, baseline):
            if p is not None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(root, ignore_errors=True)
        if baseline_root is not None:
            shutil.rmtree(baseline_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
