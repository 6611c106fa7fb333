#!/usr/bin/env python3
"""MIG planning on its worst cases, beside an ordinary plan.

Every case plans one config for all 8 GPUs of a simulated DGX A100 (the inventory is read
once; only ``plan()`` is timed, median of ``--runs``):

- ordinary: the mixed layout ``all-balanced`` (1g.5gb x2, 2g.10gb, 3g.20gb) from MIG off;
- near capacity: the layouts that make the search work hardest while still fitting (seven
  1-slice compute instances spread over GPU instances of several sizes);
- refused: more instances than a GPU holds (22, 300 and 100,000 of one profile), every
  profile at its own limit at once, and 1c.3g.20gb x 500 (compute-instance forms);
- random: ``--random`` random requests (up to 40 compute instances over up to 6
  profiles) solved for one GPU: median and 99th percentile time, and the most search
  steps a Budget counted for any of them.

    python3 bench/mig_plan_worst.py [--runs 50] [--random 2000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time

CASES = {
    "ordinary (all-balanced)": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    "near capacity (7x 1c, 3 sizes)": {"1c.3g.20gb": 3, "1c.2g.10gb": 2, "1g.5gb": 2},
    "near capacity (1c.7g.40gb x7)": {"1c.7g.40gb": 7},
    "refused: 1g.5gb x22": {"1g.5gb": 22},
    "refused: 1g.5gb x300": {"1g.5gb": 300},
    "refused: 1g.5gb x100000": {"1g.5gb": 100_000},
    "refused: 1c.3g.20gb x500": {"1c.3g.20gb": 500},
    "refused: every profile at its limit": {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3,
                                            "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
}


def spec_for(devices: dict):
    from hostagent.mig.spec import parse_spec
    items = ", ".join(f'"{k}": {v}' for k, v in devices.items())
    return parse_spec(f"version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
                      f"      mig-devices: {{{items}}}\n", "bench")


def time_plan(inventory, spec, runs: int) -> tuple[float, str]:
    from hostagent.mig.planner import PlanError, plan
    samples, outcome = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        try:
            plan(inventory, spec, "c")
            outcome = "planned"
        except PlanError:
            outcome = "refused"
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), outcome


def random_requests(inventory, count: int, seed: int = 1):
    """(median s, 99th percentile s, most search steps and that request's size) over
    ``count`` random single-GPU requests."""
    from hostagent.mig.profiles import ci_shapes
    from hostagent.mig.quirks import mig_profiles
    from hostagent.mig.solver import Budget, Geometry, Infeasible, solve
    rng = random.Random(seed)
    geo = Geometry.of(mig_profiles(inventory.gpus[0]))
    times, most = [], (0, 0, 0)
    for _ in range(count):
        request = {}
        for p in rng.sample(geo.profiles, rng.randint(1, min(6, len(geo.profiles)))):
            shapes = [s.slices for s in ci_shapes(p.slices)]
            request[p.id] = [rng.choice(shapes) for _ in range(rng.randint(1, 40 // 6 + 1))]
        budget = Budget()
        start = time.perf_counter()
        try:
            solve(geo, request, budget=budget)
        except Infeasible:
            pass
        times.append(time.perf_counter() - start)
        if budget.steps > most[0]:
            most = (budget.steps, sum(len(v) for v in request.values()), len(request))
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99)], most


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50, help="plan() calls per case")
    ap.add_argument("--random", type=int, default=2000, help="random single-GPU requests")
    args = ap.parse_args()

    from hostagent.devices import read_inventory
    from hostagent.sim.platform import simulated_host
    from hostagent.sim.driverroot import create_node

    root = tempfile.mkdtemp(prefix="hostagent-bench-mig-worst-")
    try:
        create_node(root, "dgx-a100")
        inventory = read_inventory(simulated_host(root))
        results = {name: time_plan(inventory, spec_for(devices), args.runs) for name, devices in CASES.items()}
        # The same cases again, so a slow first pass (cold caches) does not decide a ratio.
        results = {name: min(results[name], time_plan(inventory, spec_for(CASES[name]), args.runs))
                   for name in CASES}
        worst = random_requests(inventory, args.random)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    base = results["ordinary (all-balanced)"][0]
    print(f"plan(), 8x A100-SXM4-40GB from MIG disabled, median of {args.runs} runs")
    print(f"  {'case':40} {'outcome':>8} {'median ms':>10} {'x ordinary':>11}")
    for name, (med, outcome) in results.items():
        print(f"  {name:40} {outcome:>8} {med * 1e3:10.3f} {med / base:11.2f}")
    median, p99, (steps, cis, profiles) = worst
    print(f"\n{args.random} random requests on one GPU (up to 40 compute instances, 6 profiles): "
          f"median {median * 1e3:.3f} ms, 99th percentile {p99 * 1e3:.3f} ms; the most search steps "
          f"any took: {steps} ({cis} compute instances over {profiles} profiles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
