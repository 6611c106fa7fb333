#!/usr/bin/env python3
"""Whole-process time of `hostagent cdi generate` on a simulated DGX A100 with every GPU
in all-1g.5gb (56 MIG devices), side by side with `python3 -c pass`, and the same node
seen as a host mounted at its directory (`--host-root`, as the DaemonSet's container runs:
paths resolved within the root, host paths in the spec).

Both run this interpreter: hostagent through the console script installed beside it (or
`-m hostagent.cli.main`), never a `hostagent` found on PATH, which may be a wrapper (a
pyenv shim is a bash script that starts pyenv first) and would be timed with it.

    python3 bench/cdi_generate.py [--runs 20]      (as root: specs need real device nodes)
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

from startup import console_script          # bench/ is sys.path[0] when run as a script


def timed(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    from hostagent.sim.driverroot import create_node
    from hostagent.sim.files import create_cap_nodes
    from hostagent.sim.node import MIG_ENABLE

    root = tempfile.mkdtemp(prefix="hostagent-bench-")
    try:
        store = create_node(root, "dgx-a100")
        with store.mutate() as s:
            for gpu in range(8):
                s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
                s.reset_gpu(gpu)
                for start in range(7):
                    gi = s.create_gi(store.facts, gpu, 19, (start, 1))
                    s.create_ci(store.facts, gpu, gi.id, 0)
        create_cap_nodes(store.root, store.facts)
        with open(f"{root}/usr/bin/python3", "w") as f:            # the hook's, on a mounted host
            f.write(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        os.chmod(f"{root}/usr/bin/python3", 0o755)
        script = console_script()
        cli = [sys.executable, script] if script else [sys.executable, "-m", "hostagent.cli.main"]
        commands = {"python3 -c pass": [sys.executable, "-c", "pass"],
                    "hostagent cdi generate (56 MIG devices)": cli + ["--simulate", root, "cdi", "generate",
                                                                      "--output", f"{root}/spec.json"],
                    "  the same, --host-root (mounted host)": cli + ["--simulate", root, "--host-root", root, "cdi",
                                                                    "generate", "--output", f"{root}/spec2.json"]}
        for cmd in commands.values():
            timed(cmd)
        samples = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():
                samples[name].append(timed(cmd))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(samples["python3 -c pass"])
    print(f"{'command':44} {'min ms':>8} {'median ms':>10} {'x python':>9}")
    for name, times in samples.items():
        med = statistics.median(times)
        print(f"{name:44} {min(times) * 1e3:8.1f} {med * 1e3:10.1f} {med / base:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
