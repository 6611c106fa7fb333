"""kill -9 of the commands that write host files, in the middle of their writes and at random
points, then the next run.

Each loop runs a command as a process and kills it with SIGKILL: in half the rounds inside
the write of its file (held there by the ``write:FILE=stop`` crash point, its temporary
file written and not yet renamed: the test checks that the kill landed inside), in the
others at a random moment of its run (the delays span the command's own duration, measured
first). It checks what the host holds: every file is its old or its new content, never a
mix; after the next run (which completes) no temporary file is left and the content is the
new one; a MIG apply is recovered to the old or the new layout. Loops are bounded in count
and time; the seed is printed for a re-run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path


from hostagent.devices import read_inventory
from hostagent.mig.layout import Layout
from hostagent.mig.spec import parse_spec
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

INPUTS = Path(__file__).parent / "golden" / "runtime" / "inputs"
ROUNDS = 4
LOOP_SECONDS = 10


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "hostagent.cli.main", *map(str, args)]


def run(cmd) -> float:
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - start


def killed(cmd, delay: float) -> bool:
    """Run ``cmd``, SIGKILL it after ``delay`` seconds; whether it was still running."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        proc.wait(delay)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def killed_inside(cmd, target: str, folder: Path) -> bool:
    """Run ``cmd`` held in the middle of its write of ``target`` (in ``folder``), kill -9 it
    there; whether the kill landed inside the write (its temporary file was there)."""
    env = {**os.environ, "HOSTAGENT_FAULT": f"write:{target}=stop"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    try:
        until(lambda: proc.poll() is not None or _state(proc.pid) == "T", 60, f"{cmd[3:6]} held at {target}")
        return proc.poll() is None and any(p.name.startswith(f".{target}.") and p.name.endswith(".tmp")
                                           for p in folder.iterdir())
    finally:
        proc.kill()
        proc.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def temporaries(*folders) -> list[str]:
    return sorted(str(p) for f in folders if Path(f).is_dir() for p in Path(f).iterdir() if p.name.endswith(".tmp"))


def loop(name: str, reset, command, check_killed, check_next, target: str, folder: Path):
    """``reset()`` puts the old state back; ``command`` is killed inside its write of
    ``target`` (in ``folder``) and at random points of its run, ``check_killed()`` judges
    what a kill left, ``check_next()`` what the next run did."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    reset()
    duration = run(command)                         # the whole run, once, to aim the random kills
    check_next()
    deadline = time.monotonic() + LOOP_SECONDS
    inside, outcomes = [], []
    for round_ in range(ROUNDS):
        if round_ >= 2 and time.monotonic() > deadline:
            break
        reset()
        if round_ % 2 == 0:
            inside.append(killed_inside(command, target, folder))
        else:
            outcomes.append(killed(command, duration * rng.uniform(0.4, 1.1)))
        check_killed()
        run(command)                                # the next run cleans up and completes
        check_next()
    print(f"{name}: seed {seed}, {len(inside)} kills aimed at the write of {target}, {sum(inside)} inside it; "
          f"{len(outcomes)} at random, {sum(outcomes)} before the end; run {duration:.2f} s")
    assert len(inside) >= 1 and all(inside), f"a kill aimed at the write of {target} did not land inside it"


def test_kill9_during_runtime_configure(tmp_path):
    root = tmp_path / "root"
    etc = root / "etc/containerd"
    backups = tmp_path / "backups"
    old = {"config.toml": (INPUTS / "containerd-default-v2.toml").read_text(), "conf.d/99-hostagent.toml": None}
    command = cli("--simulate", root, "runtime", "configure", "--runtime", "containerd", "--backup-dir", backups)

    def reset():
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(backups, ignore_errors=True)
        etc.mkdir(parents=True)
        (etc / "config.toml").write_text(old["config.toml"])

    def files():
        return {rel: (etc / rel).read_text() if (etc / rel).exists() else None for rel in old}

    reset()
    run(command)
    new = files()
    assert new != old and all(new.values())

    def check_killed():
        now = files()
        for rel in old:
            assert now[rel] in (old[rel], new[rel]), f"{rel} is neither old nor new after a kill"

    def check_next():
        assert files() == new
        assert temporaries(etc, etc / "conf.d", backups) == []

    loop("runtime configure", reset, command, check_killed, check_next, "config.toml", etc)


def test_kill9_during_cdi_refresh(make_node):
    host, _ = make_node("hgx-h100")
    spec = host.cdi_dir / "nvidia.com-gpu.json"
    old_cmd = cli("--simulate", host.root, "cdi", "refresh", "--device-name-strategy", "uuid")
    command = cli("--simulate", host.root, "cdi", "refresh")
    run(old_cmd)
    old = spec.read_text()
    run(command)
    new = spec.read_text()
    assert old != new

    def reset():
        spec.write_text(old)

    def check_killed():
        assert spec.read_text() in (old, new)

    def check_next():
        assert spec.read_text() == new
        assert temporaries(host.cdi_dir) == []

    loop("cdi refresh", reset, command, check_killed, check_next, spec.name, host.cdi_dir)


CONFIG = """version: v1
mig-configs:
  old:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - devices: [2]
      mig-enabled: false
  new:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1c.3g.40gb": 2, "3g.40gb": 1}
    - devices: [1]
      mig-enabled: false
    - devices: [2]
      mig-enabled: true
      mig-devices: {"2g.20gb": 3}
"""


@GPU_CHANGES
def test_kill9_during_mig_apply(make_node, tmp_path):
    host, _ = make_node("hgx-h100")
    cfg = tmp_path / "mig.yaml"
    cfg.write_text(CONFIG)
    spec = parse_spec(CONFIG)
    state = host.state_dir / "mig"
    command = cli("--simulate", host.root, "mig", "apply", "-f", cfg, "-c", "new")

    def layouts():
        return {g.index: Layout.of(g) for g in read_inventory(host).gpus}

    from hostagent.mig import service
    service.apply(host, spec, "old")
    old = layouts()
    service.apply(host, spec, "new")
    new = layouts()
    assert old != new

    def reset():
        service.apply(host, spec, "old")
        assert layouts() == old

    def check_killed():
        # What the next command does first: recover. It ends in the old or the new layout.
        service.recover_pending(host)
        assert layouts() in (old, new)
        assert not (state / "journal.json").exists()
        json.loads((state / "checkpoint.json").read_text())            # never half-written

    def check_next():
        assert layouts() == new
        assert temporaries(state, host.cdi_dir) == []

    loop("mig apply", reset, command, check_killed, check_next, "journal.json", state)
