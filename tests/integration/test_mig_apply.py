"""Applying MIG configs to simulated nodes through pynvml: bundled configs on every
profile, explicit placements, minimal disruption measured in NVML calls, scoped resets,
mode semantics per architecture, in-use instances, capability nodes."""

import os
import stat

import pynvml as N
import pytest

from hostagent.devices import read_inventory
from hostagent.errors import StateError
from hostagent.mig import service
from hostagent.mig.defaults import default_spec
from hostagent.mig.layout import Layout
from hostagent.mig.plan import CREATE_CI, CREATE_GI, DESTROY_CI, DESTROY_GI
from hostagent.mig.planner import PlanError
from hostagent.mig.spec import parse_spec
from hostagent.sim import control
from hostagent.sim.driverroot import create_node
from hostagent.sim.files import mig_minors
from hostagent.sim.platform import simulated_host
from tests.rootneeds import GPU_CHANGES

pytestmark = GPU_CHANGES

CALLS = {CREATE_GI: "nvmlDeviceCreateGpuInstanceWithPlacement", DESTROY_GI: "nvmlGpuInstanceDestroy",
         CREATE_CI: "nvmlGpuInstanceCreateComputeInstanceWithPlacement", DESTROY_CI: "nvmlComputeInstanceDestroy"}


def layouts(host) -> dict[int, Layout]:
    return {g.index: Layout.of(g) for g in read_inventory(host).gpus if g.mig}


def spec(text: str):
    return parse_spec("version: v1\nmig-configs:\n" + text)


def cap_minors(host) -> set[int]:
    return {int(n[len("nvidia-cap"):]) for n in os.listdir(host.dev("nvidia-caps"))} - {1, 2}


def expected_minors(host) -> set[int]:
    table = mig_minors()
    out = set()
    for g in read_inventory(host).gpus:
        if g.mig_enabled:
            for gi in g.mig.gpu_instances:
                out.add(table[f"gpu{g.minor}/gi{gi.id}/access"])
                out |= {table[f"gpu{g.minor}/gi{gi.id}/ci{c.id}/access"] for c in gi.compute_instances}
    return out


def bundled_order(names):
    """all-enabled first and all-disabled last, so mode changes happen twice per run."""
    middle = sorted(n for n in names if n not in ("all-enabled", "all-disabled"))
    return ["all-enabled", *middle, "all-disabled"]


@pytest.mark.parametrize("profile", ["dgx-a100", "hgx-h100", "hgx-h200", "a30x4", "mixed", "t4x2"])
def test_every_bundled_config_applies_and_asserts(make_node, profile):
    host, _ = make_node(profile)
    bundled = default_spec(read_inventory(host))
    names = list(bundled.configs)
    if profile == "t4x2":
        assert names == ["all-disabled"]
    else:
        assert {"all-disabled", "all-enabled", "all-balanced"} <= set(names)
        assert any(n.startswith("all-1g.") for n in names)
    for name in bundled_order(names) if len(names) > 1 else names:
        service.apply(host, None, name)
        service.check(host, None, name)          # assert: nothing left to change
        inv = read_inventory(host)
        _, entries = bundled.select(name)
        for gpu in inv.gpus:
            entry = next((e for e in entries if e.selects(gpu.index, gpu.pci_device_id)), None)
            if entry is None or gpu.mig is None:
                continue
            assert gpu.mig.enabled == entry.mig_enabled and not gpu.mig.change_pending, (name, gpu.index)
            assert Layout.of(gpu).counts() == dict(entry.mig_devices), (name, gpu.index)
        assert cap_minors(host) == expected_minors(host), name


def test_mixed_node_default_uses_device_filters(make_node):
    host, _ = make_node("mixed")
    bundled = default_spec(read_inventory(host))
    entry, = bundled.configs["all-1g.10gb"]
    assert [str(f) for f in entry.device_filter] == ["0x20B210DE"]        # never the T4
    assert bundled.configs["all-disabled"][0].device_filter == ()


def test_order_sensitive_guide_layout_applies_with_placements(make_node):
    host, _ = make_node("dgx-a100")
    cfg = spec('  guide:\n    - devices: [0]\n      mig-enabled: true\n'
               '      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}\n')
    service.apply(host, cfg, "guide")
    got = layouts(host)[0]
    assert [(g.profile, str(g.placement)) for g in got.gis] == \
        [("2g.10gb", "0:2"), ("1g.5gb", "2:1"), ("1g.5gb", "3:1"), ("3g.20gb", "4:4")]
    service.check(host, cfg, "guide")


def two_gpus(devices: dict) -> str:
    items = ", ".join(f'"{k}": {v}' for k, v in devices.items())
    return f"    - devices: [0, 1]\n      mig-enabled: true\n      mig-devices: {{{items}}}\n"


TARGETS = spec("  balanced:\n" + two_gpus({"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})
               + "  small:\n" + two_gpus({"1g.5gb": 7})
               + "  halves:\n" + two_gpus({"3g.20gb": 2})
               + "  shared:\n" + two_gpus({"1c.3g.20gb": 1, "2c.3g.20gb": 1, "3g.20gb": 1})
               + "  whole:\n" + two_gpus({"2c.7g.40gb": 3, "1c.7g.40gb": 1}))


def test_nvml_create_and_destroy_calls_equal_the_planned_difference(make_node):
    host, _ = make_node("dgx-a100")
    service.apply(host, TARGETS, "balanced")
    for target in ("small", "halves", "shared", "balanced", "whole", "shared"):
        plan, _ = service.plan(host, TARGETS, target)
        before = dict(N.nvmlLib.calls)
        service.apply(host, TARGETS, target)
        made = {a: N.nvmlLib.calls[f] - before.get(f, 0) for a, f in CALLS.items()}
        assert made == {a: sum(g.count(a) for g in plan.gpus) for a in CALLS}, target
        assert N.nvmlLib.calls["nvmlDeviceCreateGpuInstance"] == 0      # never without a placement
        assert N.nvmlLib.calls["nvmlGpuInstanceCreateComputeInstance"] == 0
    # balanced -> small keeps the two 1g.5gb instances of each GPU: 5 new GIs, not 7.
    service.apply(host, TARGETS, "balanced")
    before = N.nvmlLib.calls[CALLS[CREATE_GI]]
    service.apply(host, TARGETS, "small")
    assert N.nvmlLib.calls[CALLS[CREATE_GI]] - before == 2 * 5


def test_already_applied_config_makes_no_nvml_mutation(make_node):
    host, _ = make_node("hgx-h100")
    service.apply(host, None, "all-balanced")
    before = dict(N.nvmlLib.calls)
    result = service.apply(host, None, "all-balanced")
    assert not result.plan.changed and result.report is None
    mutating = [f for f in N.nvmlLib.calls if N.nvmlLib.calls[f] != before.get(f, 0)
                and ("Create" in f or "Destroy" in f or "SetMigMode" in f)]
    assert mutating == []


def test_one_gpus_change_never_touches_another(make_node, persistenced):
    # mig-parted clears every MIG GPU of the config and resets every GPU; here GPU 1 keeps
    # its instances (and a process on it) while GPU 0 changes mode with a reset.
    host, store = make_node("dgx-a100")
    service.apply(host, spec('  one:\n    - devices: [1]\n      mig-enabled: true\n'
                             '      mig-devices: {"3g.20gb": 2}\n'), "one")
    control.hold(store, "1:0")
    persistenced(store)
    kept = layouts(host)[1]
    result = service.apply(host, spec('  both:\n    - devices: [0, 1]\n      mig-enabled: true\n'
                                      '      mig-devices: {"3g.20gb": 2}\n'), "both")
    assert result.report.run.resets == [0]
    assert layouts(host)[1] == kept and layouts(host)[0].counts() == {"3g.20gb": 2}
    control.release(store)


def test_mode_switches_without_reset_unless_a_driver_client_holds_an_ampere_gpu(make_node, persistenced):
    host, _ = make_node("hgx-h100")
    result = service.apply(host, None, "all-enabled")
    assert result.report.run.resets == [] and all(l.enabled for l in layouts(host).values())
    host, _ = make_node("a30x4")             # Ampere resets an idle GPU itself: no reset step
    result = service.apply(host, None, "all-balanced")
    assert result.report.run.resets == [] and all(l.enabled for l in layouts(host).values())
    host, store = make_node("a30x4")
    persistenced(store)
    result = service.apply(host, None, "all-balanced")
    assert result.report.run.resets == [0, 1, 2, 3]
    assert all(l.counts() == {"1g.6gb": 2, "2g.12gb": 1} for l in layouts(host).values())


def test_skip_reset_leaves_ampere_pending_until_reboot(make_node, persistenced):
    host, store = make_node("dgx-a100")
    persistenced(store)
    service.apply(host, None, "all-enabled", mode_only=True, skip_reset=True)
    assert all((l.enabled, l.pending) == (False, True) for l in layouts(host).values())
    with pytest.raises(service.NotApplied):
        service.check(host, None, "all-enabled", mode_only=True)
    control.reboot(store)                    # Ampere keeps the pending mode in InfoROM
    service.check(host, None, "all-enabled", mode_only=True)


def test_skip_reset_on_an_idle_ampere_gpu_that_switched_at_once(make_node):
    # The plan leaves the mode pending (no reset allowed); the driver switched it at once.
    host, store = make_node("dgx-a100")
    result = service.apply(host, None, "all-enabled", mode_only=True, skip_reset=True)
    assert result.report.run.resets == []
    assert all((l.enabled, l.pending) == (True, True) for l in layouts(host).values())
    service.check(host, None, "all-enabled", mode_only=True)


def test_reset_required_mode_changes_wait_for_a_reboot(make_node):
    # VM passthrough: the driver cannot reset the GPU, so the activation status says a
    # reboot is needed; the apply rolls back, and --mode-only --skip-reset leaves the mode
    # pending for the reboot the hint asks for.
    host, store = make_node("dgx-a100")
    with store.mutate() as s:
        s.gpus[3].passthrough = True
    before = layouts(host)
    with pytest.raises(StateError) as e:
        service.apply(host, None, "all-balanced")
    msg = e.value.message
    assert "GPU 3: the MIG mode change needs a reboot (activation status RESET_REQUIRED" in msg
    assert "apply with --mode-only --skip-reset, reboot, then apply again" in msg and "rolled back" in msg
    assert layouts(host) == before
    service.apply(host, None, "all-balanced", mode_only=True, skip_reset=True)
    assert (layouts(host)[3].enabled, layouts(host)[3].pending) == (False, True)
    control.reboot(store)
    service.apply(host, None, "all-balanced")
    assert all(l.counts() == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1} for l in layouts(host).values())


def test_in_use_instances_are_not_destroyed_without_force(make_node):
    host, store = make_node("hgx-h100")
    service.apply(host, None, "all-3g.40gb")
    proc = control.hold(store, "2:0", name="trainer")
    before = layouts(host)
    with pytest.raises(StateError) as e:
        service.apply(host, None, "all-7g.80gb")
    msg = e.value.message
    assert "GPU 2 GI 1 CI 0 by pid" in msg and str(proc.pid) in msg and "sleep" in msg
    assert "--force" in msg and "rolled back" in msg
    mig = next(d for d in read_inventory(host).gpus[2].mig.devices if (d.gi, d.ci) == (1, 0))
    assert e.value.code == "in_use" and e.value.details == {
        "devices": [{"uuid": mig.uuid, "gpu": 2, "gpu_instance": 1, "compute_instance": 0}],
        "processes": [{"pid": proc.pid, "name": "sleep", "gpu": 2, "gpu_instance": 1, "compute_instance": 0}]}
    assert layouts(host) == before
    result = service.apply(host, None, "all-7g.80gb", force=True)
    assert any(str(proc.pid) in t for t in result.report.run.terminated)
    assert all(l.counts() == {"7g.80gb": 1} for l in layouts(host).values())
    assert store.read().processes == []


def test_a_gpu_in_use_cannot_change_mode_and_the_processes_are_named(make_node):
    host, store = make_node("hgx-h100")
    proc = control.hold(store, "5")
    with pytest.raises(StateError, match=f"GPU 5 by pid {proc.pid}") as e:
        service.apply(host, None, "all-enabled")
    assert e.value.code == "in_use" and e.value.details["devices"] == [
        {"uuid": read_inventory(host).gpus[5].uuid, "gpu": 5, "gpu_instance": None, "compute_instance": None}]
    assert not any(l.enabled or l.pending for l in layouts(host).values())
    control.release(store)


def test_infeasible_config_changes_nothing(make_node):
    host, store = make_node("dgx-a100")
    service.apply(host, None, "all-balanced")
    before = store.state_file.read_text()
    with pytest.raises(PlanError, match="nothing was changed"):
        service.apply(host, spec('  big:\n    - devices: all\n      mig-enabled: true\n'
                                 '      mig-devices: {"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}\n'), "big")
    assert store.state_file.read_text() == before


def test_capability_nodes_follow_the_layout_as_real_character_devices(make_node):
    if os.geteuid() != 0:
        pytest.skip("character devices need root")
    host, store = make_node("a30x4")
    service.apply(host, None, "all-balanced")
    major = store.facts.majors["nvidia-caps"]
    minors = expected_minors(host)
    assert cap_minors(host) == minors and len(minors) == 4 * 6
    for minor in minors:
        st = os.lstat(host.dev(f"nvidia-caps/nvidia-cap{minor}"))
        assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major and os.minor(st.st_rdev) == minor
        assert st.st_mode & 0o777 == 0o444
    service.apply(host, None, "all-disabled")
    assert cap_minors(host) == set()
    assert os.path.exists(host.dev("nvidia-caps/nvidia-cap1"))     # config/monitor stay


def test_capability_nodes_are_regular_files_where_the_node_has_no_real_devices(tmp_path):
    create_node(tmp_path, "a30x4", real_nodes=False)
    host = simulated_host(tmp_path)
    service.apply(host, None, "all-4g.24gb")
    minors = expected_minors(host)
    assert cap_minors(host) == minors
    assert all(os.path.isfile(host.dev(f"nvidia-caps/nvidia-cap{m}")) for m in minors)


def test_layout_change_hook_runs_after_every_change_and_may_take_the_node_lock(make_node):
    from hostagent.lock import node_lock
    from hostagent.mig.executor import MigApplyError
    host, _ = make_node("hgx-h100")
    seen = []

    def refresh(h):                         # a CDI refresh takes the node lock itself
        with node_lock(h, "cdi refresh", timeout=0.5):
            seen.append({i: l.counts() for i, l in layouts(h).items()})

    service.apply(host, None, "all-balanced", on_layout_changed=refresh)
    assert len(seen) == 1 and seen[0][7] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    service.apply(host, None, "all-balanced", on_layout_changed=refresh)
    assert len(seen) == 1                   # nothing changed, nothing to refresh
    N.nvmlLib.inject("error", after=3)
    with pytest.raises(MigApplyError):
        service.apply(host, None, "all-1g.10gb", on_layout_changed=refresh)
    assert len(seen) == 2 and seen[1] == seen[0]     # refreshed after the rollback too
