#!/usr/bin/env python3
"""Start-up cost of the CLI, measured side by side with a bare interpreter.

Times whole processes (fork, exec, imports, work, exit) for:
  python3 -c pass                                   the floor any Python CLI pays
  hostagent --version                               the package floor: no command's parser or module
  python3 -m hostagent.cli.main --version           the same without the console script
  hostagent node --help                             CLI start-up with a real command's parser
  hostagent --simulate ROOT devices -o json         a full inventory on a simulated DGX A100
"hostagent" is the console script installed with the interpreter running this benchmark,
never whatever PATH finds first (a pyenv shim is a bash script that starts several
processes; an older install measures other code). Runs are interleaved so machine noise
hits all commands alike; prints min/median and the ratio of each median to the bare
interpreter's.

    python3 bench/startup.py [--runs 30] [--profile dgx-a100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def console_script() -> str | None:
    """This interpreter's ``hostagent`` script, if hostagent is installed for it."""
    for directory in (sysconfig.get_path("scripts"), Path(sys.executable).parent):
        script = Path(directory) / "hostagent"
        if script.is_file() and os.access(script, os.X_OK):
            return str(script)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--profile", default="dgx-a100")
    args = ap.parse_args()

    module = [sys.executable, "-m", "hostagent.cli.main"]
    script = console_script()
    cli = [script] if script else module
    package = subprocess.run([sys.executable, "-c", "import hostagent; print(hostagent.__file__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    print(f"hostagent: {script or 'no console script for ' + sys.executable + '; python -m'} "
          f"(package {Path(package).parent})")
    root = tempfile.mkdtemp(prefix="hostagent-bench-")
    try:
        subprocess.run(cli + ["sim", "create", "--profile", args.profile, "--root", root],
                       check=True, stdout=subprocess.DEVNULL)
        commands = {
            "python3 -c pass": [sys.executable, "-c", "pass"],
            "hostagent --version": cli + ["--version"],
            "python3 -m hostagent.cli.main --version": module + ["--version"],
            "hostagent node --help": cli + ["node", "--help"],
            f"hostagent devices -o json ({args.profile})": cli + ["--simulate", root, "devices", "-o", "json"],
        }
        if not script:
            del commands["hostagent --version"]
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
