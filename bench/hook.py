#!/usr/bin/env python3
"""Container-start cost of the hook program, measured side by side with bare interpreters.

Times whole processes (fork, exec, interpreter start, imports, work, exit) with Python
timers, interleaved so machine noise hits every command alike:

  python3 -I -S -c pass                 the floor of any Python process
  python3 -I -c pass                    the same with site (what the hook really pays)
  hook --help                           interpreter plus the hook's own start-up
  hook create-symlinks (links only)     a container's second start, links already there
  hook prepare (links + ld cache)       what a CDI spec runs at every container start
  ldconfig -r ROOT (bare, unconfined)   the host ldconfig binary's own share

against a prepared container root holding a driver's worth of fake libraries (real ELF
objects with SONAMEs). It also times the sandboxed ldconfig step in-process, so the
share of a hook run spent there is visible. prepare needs root (namespaces, mounts);
without it only the other rows are printed.

    python3 bench/hook.py [--runs 30] [--libraries 40]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

LIB = "/usr/lib/x86_64-linux-gnu"
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
VERSION = "550.54.15"


def build_root(base: str, count: int) -> tuple[str, bytes, list[str]]:
    """A bundle whose rootfs has ``count`` driver libraries; returns (root, state, link args)."""
    from hostagent.sim.elf import write_shared_object
    root = os.path.join(base, "bundle", "rootfs")
    libdir = os.path.join(root, LIB.lstrip("/"))
    os.makedirs(libdir)
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(base, "bundle", "config.json"), "w") as f:
        json.dump({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}, f)
    links = []
    for i in range(count):
        name = "libcuda" if i == 0 else f"libnvidia-bench{i}"
        write_shared_object(os.path.join(libdir, f"{name}.so.{VERSION}"), f"{name}.so.1")
        links += ["--link", f"{name}.so.{VERSION}::{LIB}/{name}.so.1", "--link", f"{name}.so.1::{LIB}/{name}.so"]
    state = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": os.getpid(),
                        "bundle": os.path.join(base, "bundle")}).encode()
    return root, state, links


def timed(cmd: list[str], stdin: bytes) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, input=stdin, env=ENV, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - start


def sandbox_share(root: str, runs: int) -> list[float]:
    """In-process times of the confined ldconfig step (fork, namespaces, mounts, exec, wait)."""
    from hostagent.hooks import hostbin
    from hostagent.hooks.inroot import Root
    from hostagent.hooks.sandbox import run_ldconfig
    exe = hostbin.open_ldconfig("/sbin/ldconfig")
    sealed = hostbin.sealed_copy(exe)
    fds = [fd for fd in (sealed, exe) if fd is not None]
    out = []
    try:
        with Root(root) as r:
            for _ in range(runs):
                start = time.perf_counter()
                run_ldconfig(r.fd, fds, [LIB], 10)
                out.append(time.perf_counter() - start)
    finally:
        for fd in fds:
            os.close(fd)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--libraries", type=int, default=40, help="fake driver libraries in the root (default 40)")
    args = ap.parse_args()

    py = os.path.realpath(sys.executable)
    hook = [py, "-I", "-m", "hostagent.hooks"]
    base = tempfile.mkdtemp(prefix="hostagent-hook-bench-")
    try:
        root, state, links = build_root(base, args.libraries)
        commands = {
            "python3 -I -S -c pass": [py, "-I", "-S", "-c", "pass"],
            "python3 -I -c pass": [py, "-I", "-c", "pass"],
            "hook --help": hook + ["--help"],
            f"hook create-symlinks ({len(links) // 2} links)": hook + ["create-symlinks", *links],
        }
        as_root = os.geteuid() == 0
        ldconfig = "/sbin/ldconfig.real" if os.path.exists("/sbin/ldconfig.real") else "/sbin/ldconfig"
        if as_root:
            commands["hook prepare (links + ld cache)"] = hook + ["prepare", *links, "--folder", LIB]
            commands["ldconfig -r ROOT (bare)"] = [ldconfig, "-i", "-X", "-r", root, "-C", "/bench.cache", LIB]
        for cmd in commands.values():                # warm caches; the first prepare writes everything
            timed(cmd, state)
        samples = {name: [] for name in commands}
        for i in range(args.runs):
            names = list(commands)
            names = names[i % len(names):] + names[:i % len(names)]   # rotate the order too
            for name in names:
                samples[name].append(timed(commands[name], state))
        sandbox = sandbox_share(root, args.runs) if as_root else []
    finally:
        shutil.rmtree(base, ignore_errors=True)

    floor = statistics.median(samples["python3 -I -S -c pass"])
    site = statistics.median(samples["python3 -I -c pass"])
    print(f"{'command':42} {'min ms':>8} {'median ms':>10} {'x -I -S':>8} {'x -I':>6}")
    for name, times in samples.items():
        med = statistics.median(times)
        print(f"{name:42} {min(times) * 1e3:8.1f} {med * 1e3:10.1f} {med / floor:8.2f} {med / site:6.2f}")
    if sandbox:
        prepare = statistics.median(samples["hook prepare (links + ld cache)"])
        med = statistics.median(sandbox)
        print(f"\nconfined ldconfig step, in-process: median {med * 1e3:.1f} ms "
              f"({med / prepare:.0%} of a prepare run; the bare binary: "
              f"{statistics.median(samples['ldconfig -r ROOT (bare)']) * 1e3:.1f} ms as a whole process)")
        print(f"hook prepare minus python3 -I -c pass: {(prepare - site) * 1e3:.1f} ms of imports and work")
    else:
        print("\n(not root: prepare and the ldconfig share need root and were skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
