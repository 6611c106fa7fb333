"""A fault at every step of an apply ends in the old or the new layout, never in between.

Faults come from the simulated driver beneath pynvml: an NVML error on the Nth mutating
call (the executor rolls back), or the death of the applying process before or after the
Nth call takes effect (the next ``mig`` command recovers from the journal).
"""

import json
import os
import signal
import subprocess
import sys

import pynvml as N
import pytest

from hostagent.cdi.refresh import configured_options, refresh
from hostagent.devices import read_inventory
from hostagent.mig import service
from hostagent.mig.executor import MigApplyError, MigInterrupted
from hostagent.mig.journal import APPLYING, ROLLING_BACK, Journal, read_checkpoint
from hostagent.mig.layout import Layout
from hostagent.mig.spec import parse_spec
from hostagent.sim.fakenvml import FAULT_ENV
from tests.rootneeds import GPU_CHANGES

from .test_mig_apply import cap_minors, expected_minors

pytestmark = GPU_CHANGES

# Hopper: a CI change inside a kept GI, a kept GI, a mode switch on, a mode switch off.
HOPPER = parse_spec("""
version: v1
mig-configs:
  old:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - devices: [2]
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
  new:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "1c.3g.40gb": 2}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "2g.20gb": 1}
    - devices: [2]
      mig-enabled: false
""")

# Ampere: the mode change needs a reset, in the apply and again in the rollback.
AMPERE = parse_spec("""
version: v1
mig-configs:
  old:
    - devices: [0]
      mig-enabled: false
  new:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
""")


# A30 (4 slices, Ampere): compute instances sharing a kept GPU instance change, and a
# second GPU's mode change needs a reset.
A30 = parse_spec("""
version: v1
mig-configs:
  old:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.6gb": 2, "2g.12gb": 1}
    - devices: [1]
      mig-enabled: false
  new:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1c.2g.12gb": 2, "2g.12gb": 1}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"4g.24gb": 1}
""")

# H200 (Hopper, 141 GB names): as HOPPER.
H200 = parse_spec("""
version: v1
mig-configs:
  old:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    - devices: [2]
      mig-enabled: true
      mig-devices: {"7g.141gb": 1}
  new:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "1c.3g.71gb": 2}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"3g.71gb": 1, "1g.35gb": 2}
    - devices: [2]
      mig-enabled: false
""")

CASES = [("hgx-h100", HOPPER), ("dgx-a100", AMPERE), ("a30x4", A30), ("hgx-h200", H200)]


def snapshot(host) -> dict[int, Layout]:
    return {g.index: Layout.of(g) for g in read_inventory(host).gpus}


def setup(make_node, profile, spec):
    host, store = make_node(profile)
    service.apply(host, spec, "old")
    old = snapshot(host)
    plan, _ = service.plan(host, spec, "new")
    new = {**old, **{g.index: g.after for g in plan.gpus}}
    steps = sum(len(g.steps) for g in plan.changed)
    return host, old, new, steps


def consistent(host):
    assert Journal.load(host) is None
    assert cap_minors(host) == expected_minors(host)


@pytest.mark.parametrize("profile, spec", CASES)
def test_nvml_error_at_every_step_rolls_back_to_the_old_layout(make_node, profile, spec):
    host, old, new, steps = setup(make_node, profile, spec)
    assert steps >= (5 if spec is AMPERE else 8)
    for n in range(steps):
        N.nvmlLib.inject("error", after=n, code=N.NVML_ERROR_UNKNOWN)
        with pytest.raises(MigApplyError) as e:
            service.apply(host, spec, "new")
        assert f"failed after {n} of {steps} steps" in e.value.message
        assert "rolled back to the previous layout" in e.value.message
        assert snapshot(host) == old, n
        consistent(host)
    assert N.nvmlLib.faults == []
    service.apply(host, spec, "new")          # and without a fault it goes through
    assert snapshot(host) == new
    consistent(host)


def crash_at(host, spec, action: str, n: int) -> bool:
    """Apply 'new' in a child process that dies at mutating call n; False if it finished."""
    read_inventory(host)                      # the child inherits the installed simulator
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            N.nvmlLib.faults[:] = []
            N.nvmlLib.inject(action, after=n)
            service.apply(host, spec, "new")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status):
        assert os.WEXITSTATUS(status) == 0
        return False
    assert os.WTERMSIG(status) == signal.SIGKILL
    return True


@pytest.mark.parametrize("profile, spec", CASES)
@pytest.mark.parametrize("action", ["kill-before", "kill-after"])
def test_crash_at_every_step_is_recovered_by_the_next_command(make_node, profile, spec, action):
    host, old, new, steps = setup(make_node, profile, spec)
    outcomes = []
    for n in range(steps + 1):
        crashed = crash_at(host, spec, action, n)
        if not crashed:
            assert n == steps                  # only past the last step does it finish
            assert snapshot(host) == new
            break
        assert Journal.load(host) is not None  # the crash left its journal
        note = service.recover_pending(host)   # what the next 'mig' command does first
        assert note and ("rolled back" in note or "completed" in note)
        now = snapshot(host)
        assert now in (old, new), f"{action} at step {n} left an in-between layout"
        outcomes.append("new" if now == new else "old")
        consistent(host)
        if now == new:
            service.apply(host, spec, "old")
    # Killed after its last call took effect, the apply is complete: recovery finishes it.
    assert outcomes[-1] == ("new" if action == "kill-after" else "old")
    assert outcomes[0] == "old"


def test_a_failed_rollback_keeps_the_journal_for_the_next_command(make_node):
    host, old, new, steps = setup(make_node, "hgx-h100", HOPPER)
    N.nvmlLib.inject("error", after=4)        # the apply fails at its 5th call ...
    N.nvmlLib.inject("error", after=0)        # ... and the rollback at its first
    with pytest.raises(MigApplyError, match="rolling back failed too.*journal.*is kept"):
        service.apply(host, spec=HOPPER, config="new")
    assert Journal.load(host).record.status == "rolling-back"
    assert snapshot(host) not in (old, new)
    status = service.status(host)             # any mig command finishes the rollback
    assert "rolled back" in status["notes"][0] and status["apply_in_progress"] is None
    assert snapshot(host) == old
    consistent(host)


def test_a_stop_request_interrupts_the_apply_before_its_next_gpu(make_node):
    host, old, new, steps = setup(make_node, "hgx-h100", HOPPER)
    asked = []

    def stop_after_the_first_gpu() -> bool:
        # The planner's search asks too, before the journal exists; count the executor's.
        if Journal.path(host).exists():
            asked.append(True)
        return len(asked) > 1
    with pytest.raises(MigInterrupted, match="interrupted after [1-9].*rolled back to the previous layout"):
        service.apply(host, HOPPER, "new", stop_requested=stop_after_the_first_gpu)
    assert snapshot(host) == old
    consistent(host)


def test_a_stop_requested_while_a_failed_apply_rolls_back_does_not_stop_the_rollback(make_node):
    """The daemon asked to stop while it rolls back an apply that failed (an NVML error):
    the rollback finishes and the apply's own failure is reported."""
    host, old, new, steps = setup(make_node, "hgx-h100", HOPPER)
    asked = []

    def stop_once_rolling_back() -> bool:
        journal = Journal.load(host)
        asked.append(journal and journal.record.status)
        return journal is not None and journal.record.status == ROLLING_BACK
    N.nvmlLib.inject("error", after=4)
    with pytest.raises(BaseException) as e:        # BaseException: a raw KeyboardInterrupt too
        service.apply(host, HOPPER, "new", stop_requested=stop_once_rolling_back)
    assert type(e.value) is MigApplyError, repr(e.value)
    assert f"failed after 4 of {steps} steps" in e.value.message
    assert "rolled back to the previous layout" in e.value.message
    assert APPLYING in asked                        # the forward run did ask
    assert snapshot(host) == old
    consistent(host)


def test_checkpoint_records_placements_before_anything_changes(make_node):
    host, old, new, steps = setup(make_node, "hgx-h100", HOPPER)
    service.apply(host, HOPPER, "new")
    ckpt = read_checkpoint(host)
    assert ckpt["config"] == "new"
    by_index = {g["index"]: g for g in ckpt["gpus"].values()}
    assert Layout.from_dict(by_index[0]) == old[0]
    assert [gi["placement"] for gi in by_index[0]["gpu_instances"]][:1] == [{"start": 0, "size": 2}]


def crash_cli_apply(host, tmp_path, fault: str) -> list[str]:
    """``hostagent mig apply -c new`` killed by a simulated fault; returns the CLI prefix."""
    cfg = tmp_path / "mig.yaml"
    cfg.write_text(f"version: v1\nmig-configs: {HOPPER.to_dict()['mig-configs']}\n".replace("'", '"'))
    cli = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), "mig"]
    env = {**os.environ, FAULT_ENV: fault}
    done = subprocess.run(cli + ["apply", "-f", str(cfg), "-c", "new"], env=env, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL
    return cli


def test_crashed_cli_apply_is_recovered_by_the_next_cli_command(make_node, tmp_path):
    host, old, new, steps = setup(make_node, "hgx-h100", HOPPER)
    cli = crash_cli_apply(host, tmp_path, "kill-after:6")
    status = subprocess.run(cli + ["status"], capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert "rolled back the interrupted apply of 'new'" in status.stderr
    assert snapshot(host) == old
    consistent(host)


def spec_devices(host) -> set[str]:
    spec = json.loads(host.cdi_dir.joinpath("nvidia.com-gpu.json").read_text())
    return {d["name"] for d in spec["devices"] if d["name"].startswith("MIG-")}


@pytest.mark.parametrize("verb", [["status"], ["plan", "-c", "new"], ["assert", "-c", "old"], ["export"]])
@pytest.mark.parametrize("outcome", ["rolled back", "completed"])
def test_a_recovery_by_any_read_command_refreshes_the_cdi_spec(make_node, tmp_path, verb, outcome):
    host, old, new, steps = setup(make_node, "hgx-h100", HOPPER)
    refresh(host, configured_options(host))
    stale = spec_devices(host)
    # Killed after its 7th NVML call (half-way), or after its last one (the new layout is
    # complete, only the journal remains).
    cli = crash_cli_apply(host, tmp_path, f"kill-after:{6 if outcome == 'rolled back' else steps - 1}")
    args = verb if verb[0] in ("status", "export") else verb + ["-f", str(tmp_path / "mig.yaml")]
    done = subprocess.run(cli + args, capture_output=True, text=True)
    assert f"{outcome} the interrupted apply of 'new'" in done.stderr and "CDI spec: " in done.stderr
    assert snapshot(host) == (old if outcome == "rolled back" else new)
    live = {d.uuid for g in read_inventory(host).gpus if g.mig for d in g.mig.devices}
    assert spec_devices(host) == live
    assert (live == stale) == (outcome == "rolled back")   # the same placements give the same UUIDs
