#!/usr/bin/env python3
"""MIG planning and no-op apply costs.

1. Planning time for 8 GPUs with mixed layouts: a simulated DGX A100 whose GPUs hold
   different layouts (full GPUs, shared GPU instances, empty), planned towards different
   mixed targets per GPU, so every GPU needs the placement search with keep preferences.
   The inventory is read once; only ``plan()`` is timed.
2. Whole-process time of a no-op ``hostagent mig apply`` (the config is already applied:
   lock, recovery check, inventory, plan, nothing to do) against ``python3 -c pass``,
   interleaved so machine noise hits both alike.

    python3 bench/mig_plan.py [--plans 200] [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """version: v1
mig-configs:
  start:
    - devices: [0, 4]
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    - devices: [1, 5]
      mig-enabled: true
      mig-devices: {"1c.3g.20gb": 3, "3g.20gb": 1}
    - devices: [2, 6]
      mig-enabled: true
      mig-devices: {}
    - devices: [3, 7]
      mig-enabled: true
      mig-devices: {"2c.7g.40gb": 2, "1c.7g.40gb": 1}
  target:
    - devices: [0, 4]
      mig-enabled: true
      mig-devices: {"1g.5gb": 3, "2g.10gb": 2}
    - devices: [1, 5]
      mig-enabled: true
      mig-devices: {"1c.3g.20gb": 3, "2g.10gb": 1, "1g.5gb": 2}
    - devices: [2, 6]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "3g.20gb": 1}
    - devices: [3, 7]
      mig-enabled: true
      mig-devices: {"2c.7g.40gb": 3, "1c.7g.40gb": 1}
"""


# Bytecode caching on, as for an installed package: with PYTHONDONTWRITEBYTECODE set (as in
# some CI shells) every run would recompile hostagent's sources and measure that instead.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=ENV)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=200, help="plan() calls to time")
    ap.add_argument("--runs", type=int, default=30, help="process runs per command")
    args = ap.parse_args()

    from hostagent.devices import read_inventory
    from hostagent.sim.platform import simulated_host
    from hostagent.mig import service
    from hostagent.mig.planner import plan
    from hostagent.mig.spec import parse_spec
    from hostagent.sim.driverroot import create_node

    root = tempfile.mkdtemp(prefix="hostagent-bench-mig-")
    try:
        create_node(root, "dgx-a100")
        host = simulated_host(root)
        spec = parse_spec(CONFIG, "bench")
        service.apply(host, spec, "start")
        inventory = read_inventory(host)
        result = plan(inventory, spec, "target")
        changed = len(result.changed)
        steps = sum(len(g.steps) for g in result.gpus)
        samples = []
        for _ in range(args.plans):
            start = time.perf_counter()
            plan(inventory, spec, "target")
            samples.append(time.perf_counter() - start)
        print(f"plan(): 8 GPUs, mixed layouts -> mixed targets ({changed} GPUs change, {steps} steps), "
              f"{args.plans} runs")
        print(f"  median {statistics.median(samples) * 1e3:.2f} ms, min {min(samples) * 1e3:.2f} ms, "
              f"max {max(samples) * 1e3:.2f} ms")

        # No-op apply: the config is applied already.
        service.apply(host, spec, "target")
        cfg = f"{root}/mig.yaml"
        with open(cfg, "w") as f:
            f.write(CONFIG)
        # The console script installed beside this interpreter, not a version-manager shim
        # on PATH (pyenv's adds a bash start-up of its own).
        exe = Path(sys.executable).with_name("hostagent")
        cli = [str(exe)] if exe.is_file() else [sys.executable, "-m", "hostagent.cli.main"]
        commands = {
            "python3 -c pass": [sys.executable, "-c", "pass"],
            "hostagent mig apply (no-op, 8 GPUs)": cli + ["--simulate", root, "mig", "apply", "-f", cfg,
                                                          "-c", "target"],
        }
        for cmd in commands.values():       # warm the page cache and .pyc files
            timed(cmd)
        times = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():
                times[name].append(timed(cmd))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    base = statistics.median(times["python3 -c pass"])
    print(f"\nwhole process, {args.runs} interleaved runs each (bytecode cached)")
    print(f"  {'command':40} {'min ms':>8} {'median ms':>10} {'x python':>9}")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"  {name:40} {min(t) * 1e3:8.1f} {med * 1e3:10.1f} {med / base:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
