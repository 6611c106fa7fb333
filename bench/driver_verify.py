#!/usr/bin/env python3
"""``hostagent driver verify`` beside ``hostagent devices`` on the same simulated node.

Both commands run as whole processes (start-up, imports, NVML, the host's files, output),
interleaved so machine noise hits them alike, on one simulated node per profile. Prints
min/median per command and the ratio of verify's median to devices' (goal: at most 1.5).
In-process, it also times the two halves of verify (reading the facts, judging them).

    python3 bench/driver_verify.py [--runs 20] [--profile hgx-h100 --profile dgx-a100]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def in_process(root: str, runs: int) -> tuple[float, float]:
    from hostagent.driver.checks import judge
    from hostagent.driver.probe import probe
    from hostagent.sim.platform import simulated_host
    host = simulated_host(root)
    facts = probe(host)
    read, judged = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        facts = probe(host)
        t1 = time.perf_counter()
        judge(facts)
        judged.append(time.perf_counter() - t1)
        read.append(t1 - t0)
    return statistics.median(read), statistics.median(judged)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--profile", action="append")
    args = ap.parse_args()
    cli = [sys.executable, "-m", "hostagent.cli.main"]
    print(f"{'profile':10} {'command':16} {'min ms':>8} {'median ms':>10}")
    for profile in args.profile or ["hgx-h100", "dgx-a100"]:
        root = tempfile.mkdtemp(prefix="hostagent-bench-")
        try:
            subprocess.run(cli + ["sim", "create", "--profile", profile, "--root", root],
                           check=True, stdout=subprocess.DEVNULL)
            commands = {"devices": cli + ["--simulate", root, "devices", "-o", "json"],
                        "driver verify": cli + ["--simulate", root, "driver", "verify", "-o", "json"]}
            for cmd in commands.values():       # warm the page cache and .pyc files
                timed(cmd)
            samples = {name: [] for name in commands}
            for _ in range(args.runs):
                for name, cmd in commands.items():
                    samples[name].append(timed(cmd))
            read, judged = in_process(root, args.runs)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for name, times in samples.items():
            print(f"{profile:10} {name:16} {min(times) * 1e3:8.1f} {statistics.median(times) * 1e3:10.1f}")
        ratio = statistics.median(samples["driver verify"]) / statistics.median(samples["devices"])
        print(f"{profile:10} verify/devices   {ratio:.2f}x   (in process: read {read * 1e3:.1f} ms, "
              f"judge {judged * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
