#!/usr/bin/env python3
"""GPU sharing: MPS on all 8 GPUs of a simulated DGX A100, from ``sharing apply`` to every
daemon answering.

Each run applies a config that shares every GPU with MPS (8 control daemons to start, 8
compute modes to set, 8 sets of defaults to send through the pipes), checks that all 8
daemons answer ``get_default_active_thread_percentage`` (untimed), then turns sharing off
(untimed). Timed beside it, alternately so machine noise hits both alike, the same command
line listing the devices (``hostagent devices``); then, with the daemon running, the same
apply as ``PUT /v1/sharing`` and as the command (which then goes through the daemon).

The daemons are the simulator's stand-ins (a Python process each, as every MPS command's
front end is): the figure is hostagent's orchestration plus those processes' start-up.

    python3 bench/sharing.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

CONFIG = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
# Bytecode caching on, as for an installed package.
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "HOSTAGENT_SIMULATE")}


def hostagent(root: Path, *args: str) -> list[str]:
    return [os.path.join(sysconfig.get_path("scripts"), "hostagent"), "--simulate", str(root), *args]


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True, env=ENV)
    return time.perf_counter() - start


def all_answer(host) -> int:
    from hostagent.devices import read_inventory
    from hostagent.sharing import mps
    return sum(mps.probe(host, g.uuid) for g in read_inventory(host).gpus)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7, help="runs of each command")
    args = ap.parse_args()

    from hostagent.client import Client
    from hostagent.sim.platform import simulated_host
    from hostagent.sim.driverroot import create_node

    tmp = Path(tempfile.mkdtemp(prefix="ha-bench-"))
    root = tmp / "node"
    create_node(root, "dgx-a100")
    host = simulated_host(root)
    cfg = tmp / "sharing.yaml"
    cfg.write_text(json.dumps(CONFIG))
    daemon = None
    try:
        apply, devices, ready = [], [], []
        for _ in range(args.runs):
            apply.append(timed(hostagent(root, "sharing", "apply", "-f", str(cfg))))
            ready.append(all_answer(host))
            subprocess.run(hostagent(root, "sharing", "off"), check=True, capture_output=True, env=ENV)
            devices.append(timed(hostagent(root, "devices")))

        config = root / "etc/hostagent/config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({"daemon": {"resync_interval": 0}, "metrics": {"port": None}}))
        daemon = subprocess.Popen(hostagent(root, "serve", "--config", str(config)), env=ENV,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sock = host.host("/run/hostagent/hostagent.sock")
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        api, cli = [], []
        with Client(socket_path=sock, timeout=60) as c:
            c.node()
            for _ in range(args.runs):
                start = time.perf_counter()
                c.sharing_apply(CONFIG)
                api.append(time.perf_counter() - start)
                ready.append(all_answer(host))
                c.sharing_apply(None)
                cli.append(timed(hostagent(root, "sharing", "apply", "-f", str(cfg))))
                ready.append(all_answer(host))
                c.sharing_apply(None)
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        subprocess.run(hostagent(root, "sharing", "off"), capture_output=True, env=ENV)
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    print(f"MPS on 8 GPUs (simulated DGX A100), {args.runs} runs each, medians (min-max):")
    print(f"  hostagent sharing apply (CLI, no daemon):   {med(apply):.2f} s ({min(apply):.2f}-{max(apply):.2f})")
    print(f"  PUT /v1/sharing (through the daemon):       {med(api):.2f} s ({min(api):.2f}-{max(api):.2f})")
    print(f"  hostagent sharing apply (CLI, daemon runs): {med(cli):.2f} s ({min(cli):.2f}-{max(cli):.2f})")
    print(f"  hostagent devices (same runs, interleaved): {med(devices):.2f} s "
          f"({min(devices):.2f}-{max(devices):.2f})")
    print(f"  apply / devices: {med(a / d for a, d in zip(apply, devices)):.1f}x")
    print(f"  daemons answering after each apply: {sorted(set(ready))} of 8")
    return 0 if set(ready) == {8} else 1


if __name__ == "__main__":
    sys.exit(main())
