#!/usr/bin/env python3
"""Start-up cost of the CLI, measured side by side with a bare interpreter.

Times whole processes (fork, exec, imports, work, exit) for:
  python3 -c pass                                   the floor any Python CLI pays
  hostagent --version                               CLI start-up alone
  hostagent --simulate ROOT devices -o json         a full inventory on a simulated DGX A100
Runs are interleaved so machine noise hits all commands alike; prints min/median and the
ratio of each median to the bare interpreter's.

    python3 bench/startup.py [--runs 30] [--profile dgx-a100]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--profile", default="dgx-a100")
    args = ap.parse_args()

    exe = shutil.which("hostagent")
    cli = [exe] if exe else [sys.executable, "-m", "hostagent.cli.main"]
    root = tempfile.mkdtemp(prefix="hostagent-bench-")
    try:
        subprocess.run(cli + ["sim", "create", "--profile", args.profile, "--root", root],
                       check=True, stdout=subprocess.DEVNULL)
        commands = {
            "python3 -c pass": [sys.executable, "-c", "pass"],
            "hostagent --version": cli + ["--version"],
            f"hostagent devices -o json ({args.profile})": cli + ["--simulate", root, "devices", "-o", "json"],
        }
        for cmd in commands.values():      # warm the page cache and .pyc files
            timed(cmd)
        samples = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():
                samples[name].append(timed(cmd))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    base = statistics.median(samples["python3 -c pass"])
    print(f"{'command':48} {'min ms':>8} {'median ms':>10} {'x python':>9}")
    for name, times in samples.items():
        med = statistics.median(times)
        print(f"{name:48} {min(times) * 1e3:8.1f} {med * 1e3:10.1f} {med / base:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
