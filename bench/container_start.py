#!/usr/bin/env python3
"""Container start cost of a GPU device: `podman run` of the same busybox image with and
without `--device nvidia.com/gpu=0` (a simulated DGX A100's spec), A/B alternated in one run.

The GPU run pays for the CDI edits (device nodes, ~12 library mounts) and one hook process
(links + linker cache). Prints medians and the ratio; bench/hook.py times the hook alone.

    python3 bench/container_start.py [--runs 15]      (root; podman, runc, busybox-static)
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.conftest import PODMAN_FLAGS, build_rootfs, host_cdi_spec  # noqa: E402


def timed(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    # A SIGTERM (timeout, a CI runner) unwinds like Ctrl-C: the specs in /etc/cdi are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from hostagent.cdi.refresh import generate
    from hostagent.cdi.render import render
    from hostagent.cdi.spec import SpecOptions
    from hostagent.sim.platform import simulated_host
    from hostagent.sim.driverroot import create_node

    work = Path(tempfile.mkdtemp(prefix="hostagent-bench-"))
    vendor = f"bench-{uuid.uuid4().hex[:8]}.hostagent.test"
    tag = f"localhost/hostagent-bench:{vendor[:14]}"
    try:
        create_node(work / "node", "dgx-a100")
        spec = render(generate(simulated_host(work / "node"), SpecOptions(vendor=vendor)).spec)
        with host_cdi_spec(f"{vendor}-gpu.json", spec):
            samples = _measure(work, tag, args.runs, vendor)
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    first = statistics.median(next(iter(samples.values())))
    print(f"{'command':32} {'min ms':>8} {'median ms':>10} {'ratio':>7}")
    for name, times in samples.items():
        med = statistics.median(times)
        print(f"{name:32} {min(times) * 1e3:8.1f} {med * 1e3:10.1f} {med / first:7.2f}")
    return 0


def _measure(work: Path, tag: str, runs: int, vendor: str) -> dict[str, list[float]]:
    """Container starts without and with the GPU, alternated, after one warm-up each."""
    rootfs = build_rootfs(work / "rootfs")
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(work / "rootfs.tar"), "."], check=True)
    subprocess.run(["podman", "import", "-q", str(work / "rootfs.tar"), tag], check=True, capture_output=True)
    base = ["podman", "run", "--rm", *PODMAN_FLAGS]
    commands = {"podman run (no GPU)": base + [tag, "true"],
                "podman run --device gpu=0": base + ["--device", f"{vendor}/gpu=0", tag, "true"]}
    for cmd in commands.values():
        timed(cmd)
    samples = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            samples[name].append(timed(cmd))
    return samples


if __name__ == "__main__":
    sys.exit(main())
