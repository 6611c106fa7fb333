"""Benchmark of the preferred allocation with topology against the NUMA-first rule before it.

    python3 bench/topology.py [--calls 2000] [--rounds 5] [--baseline REF] [--api-calls 300]

Goal: the preferred allocation over 8 and over 64 candidates costs at most 2x the NUMA-first
rule's. Measured side by side in one process, alternating in --rounds rounds of --calls calls
(ratios of medians, steadier on a shared machine than either figure):

1. The pure ranking (``daemon.preference.prefer``) on a simulated DGX-1 (dgx1-v100: the
   hybrid cube-mesh, where the choice of set matters): the 8 GPUs offered, asking 1, 2, 4 and
   8 of them, and 5 of them offered asking 2; 64 MIG devices (8 on each GPU) asking 1 and 4.
   "numa" is the rule without topology (still the fallback, the same code as before);
   "topology" the new one with the daemon's ``Links`` (searched ahead: the daemon does it
   once per topology, timed separately as "warm-up"); "cold" the first call of a kind on a
   ``Links`` not searched ahead. With --baseline REF (a git revision, e.g. the commit before
   topology came) that revision's ``preference.py`` is timed too.
2. ``POST /v1/preferred-allocation`` (4 of 8 GPUs) through the daemon on the same node,
   --api-calls calls, with the topology known, then with every GPU's topology refused
   (``sim topology off``: the daemon falls back to NUMA first), alternating.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def timed(fn, n: int) -> float:
    """Median seconds of ``fn()`` over ``n`` calls."""
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def baseline_prefer(ref: str):
    """``prefer`` of ``preference.py`` at git revision ``ref``."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:hostagent/daemon/preference.py"],
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("hostagent.daemon._baseline_preference", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "hostagent.daemon"
    sys.modules[spec.name] = module          # dataclasses look their module up there
    exec(compile(source, f"{ref}:preference.py", "exec"), module.__dict__)
    return module.prefer


def views(inventory, migs_per_gpu: int = 0) -> dict[str, dict]:
    out = {}
    for g in inventory.gpus:
        out[g.uuid] = {"kind": "gpu", "uuid": g.uuid, "index": g.index, "numa_node": g.numa_node, "name": str(g.index)}
    for g in inventory.gpus:
        for j in range(migs_per_gpu):
            uuid = f"MIG-{g.index}-{j}"
            out[uuid] = {"kind": "mig", "uuid": uuid, "index": j, "parent_index": g.index, "parent_uuid": g.uuid,
                         "name": f"{g.index}:{j}"}
    return out


def pure(args, inventory) -> None:
    from hostagent.daemon.preference import prefer
    from hostagent.topology.ranking import Links
    started = time.perf_counter()
    links = Links.of(inventory)
    links.warm()
    print(f"warm-up (Links.of + every division of every subset, once per topology): "
          f"{(time.perf_counter() - started) * 1e3:.1f} ms")
    old = baseline_prefer(args.baseline) if args.baseline else None
    gpus = views(inventory)
    migs = views(inventory, 8)
    uuids = [g.uuid for g in inventory.gpus]
    cases = [(f"8 GPUs, {k} of 8", gpus, uuids, k) for k in (1, 2, 4, 8)]
    cases.append(("8 GPUs, 2 of 5 (0 2 4 5 7)", gpus, [uuids[i] for i in (0, 2, 4, 5, 7)], 2))
    mig_ids = [u for u, v in migs.items() if v["kind"] == "mig"]
    cases += [(f"64 MIG devices, {k} of 64", migs, mig_ids, k) for k in (1, 4)]
    print(f"\n{'case':30} {'numa us':>9} {'topology us':>12} {'ratio':>6} {'cold us':>9}"
          + (f" {'baseline us':>12}" if old else ""))
    for name, v, available, size in cases:
        lookup = {k: k for k in v}
        rows = {"numa": [], "topology": [], "baseline": []}
        for _ in range(args.rounds):
            rows["numa"].append(timed(lambda: prefer(available, [], size, v, lookup, {}), args.calls))
            rows["topology"].append(timed(lambda: prefer(available, [], size, v, lookup, {}, links=links), args.calls))
            if old:
                rows["baseline"].append(timed(lambda: old(available, [], size, v, lookup, {}), args.calls))
        cold = []
        for _ in range(20):
            fresh = Links.of(inventory)
            t = time.perf_counter()
            prefer(available, [], size, v, lookup, {}, links=fresh)
            cold.append(time.perf_counter() - t)
        numa, topo = statistics.median(rows["numa"]), statistics.median(rows["topology"])
        line = f"{name:30} {numa * 1e6:9.1f} {topo * 1e6:12.1f} {topo / numa:6.2f} {statistics.median(cold) * 1e6:9.1f}"
        if old:
            line += f" {statistics.median(rows['baseline']) * 1e6:12.1f}"
        print(line)


def api(args, root: Path) -> None:
    from hostagent.sim import control
    from hostagent.sim.store import SimStore
    sys.path.insert(0, str(REPO / "tests"))
    from integration.agentd import AgentProcess
    agent = AgentProcess(root).start()
    store = SimStore(root)
    try:
        with agent.client() as c:
            uuids = [g["uuid"] for g in c.devices()["gpus"]]

            def calls():
                return timed(lambda: c.preferred_allocation(uuids, 4), args.api_calls)

            def topology(on: bool):
                for i in range(len(uuids)):
                    control.set_topology_support(store, i, on)
                c.refresh()
            known, unknown = [], []
            for _ in range(args.rounds):
                topology(True)
                known.append(calls())
                topology(False)
                unknown.append(calls())
        k, u = statistics.median(known), statistics.median(unknown)
        print(f"\nPOST /v1/preferred-allocation, 4 of 8 GPUs (p50 of {args.api_calls}, median of {args.rounds} rounds): "
              f"topology {k * 1e3:.3f} ms, NUMA first (topology refused) {u * 1e3:.3f} ms, ratio {k / u:.2f}")
    finally:
        agent.stop()
        agent.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--api-calls", type=int, default=300)
    parser.add_argument("--baseline", metavar="REF", help="also time preference.py at this git revision")
    args = parser.parse_args()
    from hostagent.devices import read_inventory
    from hostagent.sim.driverroot import create_node
    from hostagent.sim.platform import simulated_host
    root = Path(tempfile.mkdtemp(prefix="ha-topo-"))
    try:
        root.chmod(0o755)
        create_node(root, "dgx1-v100")
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; simulated dgx1-v100 in {root}")
        pure(args, read_inventory(simulated_host(root)))
        api(args, root)
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
