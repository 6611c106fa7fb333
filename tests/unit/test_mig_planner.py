"""The pure planner: name resolution per GPU, exact placement solving, minimal disruption,
mode changes. Inventories are plain records; no NVML."""

from dataclasses import replace

import pytest

from hostagent.devices.records import Placement
from hostagent.errors import UsageError
from hostagent.mig.layout import Layout
from hostagent.mig.plan import CREATE_CI, CREATE_GI, DESTROY_CI, DESTROY_GI, SET_MODE
from hostagent.mig.planner import PlanError, plan
from hostagent.mig.spec import parse_spec

from .mig_records import A30, A100, A100_80, H100, T4, gpu, inventory, profiles


def config(entries: str, name: str = "c"):
    return parse_spec(f"version: v1\nmig-configs:\n  {name}:\n{entries}")


def enabled(mig_devices: dict, devices="all") -> str:
    items = ", ".join(f'"{k}": {v}' for k, v in mig_devices.items())
    return f"    - devices: {devices}\n      mig-enabled: true\n      mig-devices: {{{items}}}\n"


DISABLED = "    - devices: all\n      mig-enabled: false\n"


def starts(layout: Layout) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for gi in layout.gis:
        out.setdefault(gi.profile, []).append(gi.start)
    return out


def test_order_sensitive_layout_from_the_mig_guide_gets_explicit_placements():
    # MIG guide: "-cgi 19,19,14,9" (1g,1g,2g,3g) fails on A100-40GB when the driver places.
    p = plan(inventory(gpu(0, A100, enabled=True)),
             config(enabled({"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})))
    after = p.gpus[0].after
    assert starts(after) == {"2g.10gb": [0], "1g.5gb": [2, 3], "3g.20gb": [4]}
    assert after.counts() == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    creates = [s for s in p.gpus[0].steps if s.action == CREATE_GI]
    assert all(s.gi.placement in {pl for prof in profiles(A100) if prof.id == s.gi.profile_id
                                  for pl in prof.placements} for s in creates)


def test_guide_example_4g_2g_1g():
    p = plan(inventory(gpu(0, A100, enabled=True)),
             config(enabled({"4g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1})))
    assert starts(p.gpus[0].after) == {"4g.20gb": [0], "2g.10gb": [4], "1g.5gb": [6]}


def test_unknown_name_on_a_targeted_gpu_names_the_gpu_and_its_profiles():
    # Issue #18: 2g.10gb exists on A100-40GB, not on A100-80GB. The 80GB GPU has MIG
    # disabled: its profile table still comes from the inventory.
    inv = inventory(gpu(0, A100, enabled=True), gpu(1, A100_80))
    with pytest.raises(PlanError) as e:
        plan(inv, config(enabled({"2g.10gb": 1})))
    msg = e.value.message
    assert "GPU 1 (NVIDIA A100-SXM4-80GB): no MIG profile '2g.10gb'" in msg
    assert "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in msg
    assert "GPU 0" not in msg and "nothing was changed" in msg


def test_names_are_resolved_per_gpu_so_untargeted_gpus_do_not_matter():
    inv = inventory(gpu(0, A100), gpu(1, A30))
    spec = config('    - device-filter: "0x20B710DE"\n      devices: all\n      mig-enabled: true\n'
                  '      mig-devices: {"1g.6gb": 4}\n')
    p = plan(inv, spec)
    assert [g.index for g in p.gpus] == [1]
    assert p.gpus[0].after.counts() == {"1g.6gb": 4}


def test_compute_instance_sizes_must_exist_in_the_gpu_instance():
    with pytest.raises(PlanError, match="a 4g.20gb GPU instance offers compute instances of 1c, 2c, 4c only"):
        plan(inventory(gpu(0, A100, enabled=True)), config(enabled({"3c.4g.20gb": 1})))


@pytest.mark.parametrize("devices, why", [
    ({"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}, "they need 8 compute slices, the GPU has 7"),
    ({"3g.20gb": 3}, "3g.20gb need more than the 2 3g.20gb GPU instances"),
    ({"1g.10gb": 4, "1g.5gb": 1}, "they need 9 memory slices, the GPU has 8"),
    ({"1g.5gb+me": 2}, "need more than the 1 1g.5gb+me GPU instance"),
    ({"1c.3g.20gb": 7}, "7x 1c.3g.20gb need more than the 2 3g.20gb GPU instances"),
])
def test_infeasible_layouts_are_rejected_with_the_clashing_profiles(devices, why):
    inv = inventory(gpu(0, A100, enabled=True))
    with pytest.raises(PlanError) as e:
        plan(inv, config(enabled(devices)))
    assert why in e.value.message


def test_media_engines_are_a_budget_of_the_whole_gpu():
    # With the real tables the +me instance count binds first; a table allowing two +me
    # instances shows the engine budget (one OFA) on its own.
    table = tuple(replace(p, instances=2) if p.name == "1g.10gb+me" else p for p in profiles(H100))
    inv = inventory(gpu(0, H100, enabled=True, table=table))
    with pytest.raises(PlanError, match="2x 1g.10gb\\+me cannot fit together: they need 2 OFA engines, the GPU has 1"):
        plan(inv, config(enabled({"1g.10gb+me": 2})))


def test_infeasible_reason_names_the_smallest_clashing_set():
    with pytest.raises(PlanError) as e:
        plan(inventory(gpu(0, A100, enabled=True)),
             config(enabled({"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1})))
    assert "1x 4g.20gb + 1x 3g.20gb + 1x 1g.5gb cannot fit together" in e.value.message


def test_media_extension_all_is_exclusive():
    # A Blackwell-like table (not among the simulated SKUs): +me.all allows only -me beside it.
    base = profiles(H100)
    one = next(p for p in base if p.name == "1g.10gb")
    table = base + (replace(one, index=15, id=50, name="1g.10gb+me.all", instances=1, ofas=1),
                    replace(one, index=13, id=51, name="1g.10gb-me", decoders=0, jpegs=0))
    inv = inventory(gpu(0, H100, enabled=True, table=table))
    with pytest.raises(PlanError, match="a \\+me.all instance allows only -me instances"):
        plan(inv, config(enabled({"1g.10gb+me.all": 1, "1g.10gb": 1})))
    ok = plan(inv, config(enabled({"1g.10gb+me.all": 1, "1g.10gb-me": 3})))
    assert ok.gpus[0].after.counts() == {"1g.10gb+me.all": 1, "1g.10gb-me": 3}


def test_compute_instances_are_packed_into_gpu_instances():
    inv = inventory(gpu(0, A100, enabled=True))
    after = plan(inv, config(enabled({"1c.3g.20gb": 6}))).gpus[0].after
    assert [(gi.profile, [c.start for c in gi.cis]) for gi in after.gis] == \
        [("3g.20gb", [0, 1, 2]), ("3g.20gb", [0, 1, 2])]
    shared = plan(inv, config(enabled({"2c.3g.20gb": 1, "1c.3g.20gb": 1}))).gpus[0].after
    assert len(shared.gis) == 1 and [(c.slices, c.start) for c in shared.gis[0].cis] == [(2, 0), (1, 2)]
    apart = plan(inv, config(enabled({"3g.20gb": 1, "1c.3g.20gb": 1}))).gpus[0].after
    assert len(apart.gis) == 2 and apart.counts() == {"3g.20gb": 1, "1c.3g.20gb": 1}


BALANCED = [("2g.10gb", 0, None), ("1g.5gb", 2, None), ("1g.5gb", 3, None), ("3g.20gb", 4, None)]


def test_a_gpu_already_giving_the_devices_is_untouched_whatever_its_placements():
    # The same devices the planner would place differently: still nothing to do.
    odd = [("1g.5gb", 0, None), ("1g.5gb", 1, None), ("2g.10gb", 2, None), ("3g.20gb", 4, None)]
    inv = inventory(gpu(0, A100, enabled=True, gis=odd), gpu(1, A100, enabled=True, gis=BALANCED))
    p = plan(inv, config(enabled({"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})))
    assert [g.changed for g in p.gpus] == [False, False] and not p.changed


def test_a_changing_gpu_keeps_instances_that_match_and_changes_only_the_difference():
    inv = inventory(gpu(0, A100, enabled=True, gis=BALANCED))
    g = plan(inv, config(enabled({"1g.5gb": 7}))).gpus[0]
    assert g.kept() == 2           # the two 1g.5gb at 2 and 3 stay
    assert (g.count(DESTROY_CI), g.count(DESTROY_GI), g.count(CREATE_GI), g.count(CREATE_CI)) == (2, 2, 5, 5)
    assert not g.mode_steps and not g.reset
    destroyed = {s.gi.profile for s in g.steps if s.action == DESTROY_GI}
    assert destroyed == {"2g.10gb", "3g.20gb"}


def test_inside_a_kept_gpu_instance_only_differing_compute_instances_change():
    inv = inventory(gpu(0, A100, enabled=True, gis=[("3g.20gb", 4, [(1, 0), (1, 1), (1, 2)])]))
    g = plan(inv, config(enabled({"1c.3g.20gb": 1, "2c.3g.20gb": 1}))).gpus[0]
    assert g.kept() == 1 and g.count(DESTROY_GI) == 0 and g.count(CREATE_GI) == 0
    assert g.count(DESTROY_CI) == 2 and g.count(CREATE_CI) == 1
    assert [(c.slices, c.start) for c in g.after.gis[0].cis] == [(2, 0), (1, 2)]   # keeps the 1c at 2


def test_an_empty_gpu_instance_is_not_a_match():
    # mig-parted's count-only view cannot see a GI without CIs; it must not survive a config.
    inv = inventory(gpu(0, A100, enabled=True, gis=[("1g.5gb", 0, [])]))
    g = plan(inv, config(enabled({}))).gpus[0]
    assert g.count(DESTROY_GI) == 1 and g.after.gis == ()


def test_mode_changes_per_architecture():
    inv = inventory(gpu(0, A100), gpu(1, H100), gpu(2, A100, enabled=True, gis=BALANCED))
    p = plan(inv, config(enabled({"1g.5gb": 1}, "[0]") + enabled({"1g.10gb": 1}, "[1]")
                         + "    - devices: [2]\n      mig-enabled: false\n"))
    a100, h100, off = p.gpus
    assert a100.reset and [s.action for s in a100.mode_steps] == [SET_MODE]
    assert not h100.reset and [s.action for s in h100.mode_steps] == [SET_MODE]
    # Disabling destroys every instance first (the driver refuses otherwise), then resets.
    assert [s.action for s in off.mode_steps] == [DESTROY_CI] * 4 + [DESTROY_GI] * 4 + [SET_MODE]
    assert off.reset and not off.config_steps and off.after == Layout(False, False)


def test_a_pending_mode_is_cancelled_without_a_reset():
    inv = inventory(gpu(0, A100, enabled=True, pending=False, gis=BALANCED))
    g = plan(inv, config(enabled({"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}))).gpus[0]
    assert [s.action for s in g.steps] == [SET_MODE] and g.steps[0].enabled and not g.reset


def test_skip_reset_leaves_ampere_modes_pending_and_needs_mode_only():
    inv = inventory(gpu(0, A100), gpu(1, H100))
    spec = config(enabled({}))
    p = plan(inv, spec, mode_only=True, skip_reset=True)
    assert p.gpus[0].after == Layout(False, True) and not p.gpus[0].reset
    assert p.gpus[1].after == Layout(True, True)            # Hopper switches at once anyway
    with pytest.raises(UsageError, match="--skip-reset"):
        plan(inv, spec, skip_reset=True)


def test_mode_only_leaves_instances_alone():
    inv = inventory(gpu(0, A100, enabled=True, gis=BALANCED), gpu(1, A100))
    p = plan(inv, config(enabled({"1g.5gb": 7})), mode_only=True)
    assert not p.gpus[0].changed and p.gpus[1].config_steps == () and p.gpus[1].reset


def test_gpus_without_mig():
    inv = inventory(gpu(0, A100), gpu(1, T4))
    assert [g.index for g in plan(inv, config(DISABLED)).gpus] == [0]     # disabled: nothing to do
    with pytest.raises(PlanError, match="GPU 1 \\(Tesla T4\\): not MIG capable"):
        plan(inv, config(enabled({})))


def test_the_last_entry_selecting_a_gpu_wins_as_in_mig_parted():
    # Defaults for every GPU, then an override: a file mig-parted applies.
    spec = config(enabled({"1g.5gb": 1}) + enabled({"1g.5gb": 2}, "[1]"))
    p = plan(inventory(gpu(0, A100), gpu(1, A100)), spec)
    assert [g.after.counts() for g in p.gpus] == [{"1g.5gb": 1}, {"1g.5gb": 2}]
    p = plan(inventory(gpu(0, A100), gpu(1, A100)), config(enabled({"1g.5gb": 2}, "[1]") + DISABLED))
    assert [g.after for g in p.gpus] == [Layout(False, False), Layout(False, False)]


def test_an_index_the_node_does_not_have_is_an_error():
    inv = inventory(*[gpu(i, A100) for i in range(8)])
    with pytest.raises(PlanError) as e:
        plan(inv, config(enabled({"1g.5gb": 1}, "[0, 9]") + enabled({}, "[12]")))
    assert ("config 'c' cannot be applied: entry 0 names GPU 9, but this node has GPU 0-7; entry 1 names "
            "GPU 12, but this node has GPU 0-7") in e.value.message


def test_indices_of_an_entry_for_other_gpu_models_are_not_this_nodes_business():
    # A fleet-wide file: the H100 entry names GPUs an A100 node lacks; mig-parted applies the
    # A100 entry and does nothing for the other (its filter matches no GPU here).
    inv = inventory(*[gpu(i, A100) for i in range(2)])
    h100 = f"0x{inventory(gpu(0, H100)).gpus[0].pci_device_id:08X}"
    a100 = f"0x{inv.gpus[0].pci_device_id:08X}"
    for other in (f'"{h100}"', f'["{h100}", "0x12345678"]', f'"{h100}:0x00000000"'):
        spec = config(enabled({"1g.5gb": 1}, "[0, 1]").replace("    - devices", f'    - device-filter: "{a100}"\n'
                                                                "      devices")
                      + enabled({"1g.10gb": 1}, "[4, 5, 6, 7]").replace("    - devices",
                                                                         f"    - device-filter: {other}\n"
                                                                         "      devices"))
        p = plan(inv, spec)
        assert [g.after.counts() for g in p.gpus] == [{"1g.5gb": 1}, {"1g.5gb": 1}]
    # The same entry with a filter this node matches still names GPUs it lacks: an error.
    spec = config(enabled({"1g.5gb": 1}, "[0, 7]").replace("    - devices", f'    - device-filter: "{a100}"\n'
                                                          "      devices"))
    with pytest.raises(PlanError, match="entry 0 names GPU 7, but this node has GPU 0, 1"):
        plan(inv, spec)


def test_gpus_with_the_same_problem_are_named_once():
    inv = inventory(*[gpu(i, A100_80) for i in range(8)], gpu(8, A100), gpu(9, T4), gpu(10, A100_80))
    with pytest.raises(PlanError) as e:
        plan(inv, config(enabled({"2g.10gb": 1})))
    msg = e.value.message
    assert msg.count("no MIG profile '2g.10gb'") == 1 and msg.count("not MIG capable") == 1
    assert ("GPU 0-7, 10 (NVIDIA A100-SXM4-80GB): no MIG profile '2g.10gb'; the profiles are 1g.10gb, "
            "1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb") in msg
    assert "GPU 9 (Tesla T4): not MIG capable" in msg and "GPU 8" not in msg


def test_diff_of_identical_layouts_is_empty_and_counts_match_steps():
    inv = inventory(gpu(0, A100, enabled=True, gis=BALANCED))
    p = plan(inv, config(enabled({"7g.40gb": 1})))
    g = p.gpus[0]
    assert g.count(DESTROY_GI) == 4 and g.count(CREATE_GI) == 1 and g.after.gis[0].placement == Placement(0, 8)
    assert p.to_dict()["changed"] == [0]


def test_planning_8_gpus_with_mixed_layouts():
    layouts = [BALANCED, [("3g.20gb", 0, [(1, 0), (1, 1), (1, 2)])], [], [("7g.40gb", 0, [(2, 0), (2, 2)])]] * 2
    inv = inventory(*[gpu(i, A100, enabled=True, gis=layouts[i]) for i in range(8)])
    targets = [{"1g.5gb": 3, "2g.10gb": 2}, {"1c.3g.20gb": 3, "2g.10gb": 1, "1g.5gb": 2}, {"1g.10gb": 2, "3g.20gb": 1},
               {"2c.7g.40gb": 3, "1c.7g.40gb": 1}] * 2
    spec = config("".join(enabled(t, f"[{i}]") for i, t in enumerate(targets)))
    p = plan(inv, spec)            # its time: bench/mig_plan.py
    assert [g.after.counts() for g in p.gpus] == targets

