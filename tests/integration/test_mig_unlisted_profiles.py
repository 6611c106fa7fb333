"""Drivers that list MIG profiles only while MIG is enabled (R535; mig-parted's
ErrNoProfilesDiscovered): an apply enables MIG first, then plans and creates the layout,
all in one transaction."""

import json
import os
import signal

import pynvml as N
import pytest

from hostagent.cli.main import main
from hostagent.devices import read_inventory
from hostagent.mig import service
from hostagent.mig.executor import MigApplyError
from hostagent.mig.journal import Journal
from hostagent.sim.store import SimStore
from tests.rootneeds import GPU_CHANGES

from .test_mig_apply import cap_minors, expected_minors, layouts, spec

pytestmark = GPU_CHANGES

BALANCED_H100 = spec('  c:\n    - devices: [0, 1]\n      mig-enabled: true\n'
                     '      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}\n')


def r535(make_node, profile):
    host, store = make_node(profile)
    facts = json.loads((store.dir / "node.json").read_text())
    facts["driver_version"] = "535.183.01"
    (store.dir / "node.json").write_text(json.dumps(facts))
    return host, SimStore(host.root)


def test_the_driver_lists_no_profile_while_mig_is_disabled(make_node):
    host, _ = r535(make_node, "hgx-h100")
    assert read_inventory(host).gpus[0].mig.profiles == ()
    service.apply(host, None, "all-enabled")
    assert len(read_inventory(host).gpus[0].mig.profiles) == 7


def test_a_layout_is_planned_after_the_mode_change(make_node, tmp_path, capsys):
    host, _ = r535(make_node, "hgx-h100")
    cfg = tmp_path / "mig.yaml"
    cfg.write_text(json.dumps(BALANCED_H100.to_dict()))
    assert main(["--simulate", str(host.root), "mig", "plan", "-f", str(cfg), "-c", "c"]) == 0
    out = capsys.readouterr().out
    assert ("GPU 0 (NVIDIA H100 80GB HBM3, 00000000:18:00.0): enable MIG, then plan its layout (profiles "
            "are listed once MIG is enabled)\n  before: MIG disabled\n  after:  MIG enabled; the layout is "
            "planned then (this driver lists MIG profiles only while MIG is enabled)\n") in out
    planned, _ = service.plan(host, BALANCED_H100, "c")
    g = planned.gpus[0]
    assert g.deferred and g.after.enabled and not g.config_steps
    assert g.summary() == "enable MIG, then plan its layout (profiles are listed once MIG is enabled)"
    assert planned.to_dict()["gpus"][0]["deferred"] is True
    with pytest.raises(service.NotApplied):
        service.check(host, BALANCED_H100, "c")
    before = dict(N.nvmlLib.calls)
    result = service.apply(host, BALANCED_H100, "c")
    assert [g.summary() for g in result.plan.gpus] == ["enable MIG, create 4 GI, create 4 CI"] * 2
    assert N.nvmlLib.calls["nvmlDeviceCreateGpuInstanceWithPlacement"] - before.get(
        "nvmlDeviceCreateGpuInstanceWithPlacement", 0) == 8
    assert {i: l.counts() for i, l in layouts(host).items() if l.enabled} == {
        0: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, 1: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
    assert cap_minors(host) == expected_minors(host) and Journal.load(host) is None
    service.check(host, BALANCED_H100, "c")


def test_a_bundled_config_made_of_profile_names_applies_too(make_node, persistenced):
    host, store = r535(make_node, "dgx-a100")        # Ampere, held by a driver client: a reset
    persistenced(store)
    planned, _ = service.plan(host, None, "all-balanced")
    assert all(g.deferred for g in planned.gpus) and "planned once MIG is enabled" in planned.warnings[-1]
    mode_only, _ = service.plan(host, None, "all-balanced", mode_only=True)
    assert all(g.after.pending and not g.deferred for g in mode_only.gpus) and len(mode_only.gpus) == 8
    result = service.apply(host, None, "all-balanced")
    assert result.report.run.resets == list(range(8))
    assert all(l.counts() == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1} for l in layouts(host).values())
    service.check(host, None, "all-balanced")


def test_a_name_the_gpu_turns_out_not_to_have_rolls_the_mode_change_back(make_node):
    host, store = r535(make_node, "hgx-h100")
    state = store.read()
    with pytest.raises(MigApplyError) as e:
        service.apply(host, spec('  c:\n    - devices: [0]\n      mig-enabled: true\n'
                                 '      mig-devices: {"2g.10gb": 1}\n'), "c")
    assert "GPU 0 (NVIDIA H100 80GB HBM3): no MIG profile '2g.10gb'" in e.value.message
    assert "rolled back to the previous layout" in e.value.message
    assert store.read().gpus == state.gpus and Journal.load(host) is None


def test_a_crash_between_the_two_passes_is_rolled_back(make_node):
    host, store = r535(make_node, "hgx-h100")
    read_inventory(host)
    pid = os.fork()
    if pid == 0:
        try:
            N.nvmlLib.faults[:] = []
            N.nvmlLib.inject("kill-after", after=1)   # both GPUs enabled, nothing created yet
            service.apply(host, BALANCED_H100, "c")
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    # The node is at the journal's 'after' (MIG on, no instances), but that is not the layout.
    assert all(l.enabled and not l.gis for i, l in layouts(host).items() if i < 2)
    note = service.recover_pending(host)
    assert note.startswith("rolled back the interrupted apply of 'c'")
    assert not any(l.enabled for l in layouts(host).values())
