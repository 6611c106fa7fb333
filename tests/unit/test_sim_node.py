"""The simulator's MIG rules, on the node model alone (no ctypes, no files)."""

import pynvml as N
import pytest
from hypothesis import given, settings, strategies as st

from hostagent.sim import catalog
from hostagent.sim.node import (MIG_DISABLE, MIG_ENABLE, NodeFacts, NodeState, SimGpu,
                                SimNvmlError, SimProcess, gpu_instance_id)


def node(*sku_keys):
    skus = {k: catalog.skus()[k] for k in sku_keys}
    facts = NodeFacts(profile="t", driver_version="550.90.07", cuda_driver_version=12040,
                      skus=skus, real_device_nodes=False, majors={})
    gpus = [SimGpu(index=i, sku=k, uuid=f"GPU-{i}", pci_bus_id=f"0000:0{i}:00.0", minor=i,
                   serial=str(i)) for i, k in enumerate(sku_keys)]
    return facts, NodeState(gpus=gpus)


def enabled(*sku_keys):
    facts, state = node(*sku_keys)
    for g in state.gpus:
        g.mig_current = g.mig_pending = MIG_ENABLE
    return facts, state


def code(fn, *args):
    with pytest.raises(SimNvmlError) as e:
        fn(*args)
    return e.value.code


A100 = "A100-SXM4-40GB"
H100 = "H100-SXM5-80GB"


def test_ampere_mode_change_is_immediate_on_an_idle_gpu():
    # MIG user guide: "sudo nvidia-smi -i 0 -mig 1" -> "Enabled MIG Mode for GPU ..." on A100.
    facts, state = node(A100)
    assert state.set_mig_mode(facts, 0, MIG_ENABLE) == N.NVML_SUCCESS
    assert (state.gpus[0].mig_current, state.gpus[0].mig_pending) == (MIG_ENABLE, MIG_ENABLE)


@pytest.mark.parametrize("holder", ["process", "driver client"])
def test_ampere_mode_change_waits_for_reset_while_held(holder):
    facts, state = node(A100)
    clients = ()
    if holder == "process":
        state.processes.append(SimProcess(pid=1, gpu=0))
    else:
        clients = ("nvidia-persistenced",)
    assert state.set_mig_mode(facts, 0, MIG_ENABLE, clients) == N.NVML_ERROR_IN_USE
    assert (state.gpus[0].mig_current, state.gpus[0].mig_pending) == (MIG_DISABLE, MIG_ENABLE)
    state.processes.clear()
    state.reset_gpu(0)                   # a driver client does not block nvidia-smi -r
    assert state.gpus[0].mig_current == MIG_ENABLE


def test_hopper_mode_change_is_immediate_unless_busy():
    facts, state = node(H100, H100)
    assert state.set_mig_mode(facts, 0, MIG_ENABLE, ("nvidia-persistenced",)) == N.NVML_SUCCESS
    assert state.gpus[0].mig_current == MIG_ENABLE
    state.processes.append(SimProcess(pid=1, gpu=1))
    assert state.set_mig_mode(facts, 1, MIG_ENABLE) == N.NVML_ERROR_IN_USE
    assert (state.gpus[1].mig_current, state.gpus[1].mig_pending) == (MIG_DISABLE, MIG_ENABLE)
    assert code(state.reset_gpu, 1) == N.NVML_ERROR_IN_USE


def test_mode_on_gpu_without_mig_is_not_supported():
    facts, state = node("T4")
    assert code(state.set_mig_mode, facts, 0, MIG_ENABLE) == N.NVML_ERROR_NOT_SUPPORTED


def test_gpu_instances_need_mig_enabled():
    facts, state = node(A100)
    assert code(state.create_gi, facts, 0, 19) == N.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize("sku, profiles, ids", [
    # MIG user guide, "Creating GPU Instances": the ids nvidia-smi printed, in order.
    (A100, (19, 19, 14), (13, 11, 3)),                   # ... and then 9 fails
    (A100, (9, 19, 14, 19), (2, 7, 4, 8)),
    (A100, (14, 19, 19, 19, 19, 19), (5, 13, 7, 8, 9, 10)),
    (A100, (9, 9), (2, 1)),                              # "-cgi 9,3g.20gb"
    (A100, (5, 14, 19), (1, 5, 13)),                     # 4g, 2g, 1g at 0:4, 4:2, 6:1
    ("A30-24GB", (14, 14, 5), (3, 4, 2)),                # a published R535 A30 session
])
def test_driver_chosen_placements_give_the_published_ids(sku, profiles, ids):
    facts, state = enabled(sku)
    assert tuple(state.create_gi(facts, 0, p).id for p in profiles) == ids


def test_driver_chosen_placements_reproduce_the_documented_order_dependence():
    # MIG user guide: on A100 "-cgi 19,19,14,9" fails, "9,19,14,19" succeeds.
    facts, state = enabled(A100)
    for pid in (19, 19, 14):
        state.create_gi(facts, 0, pid)
    assert code(state.create_gi, facts, 0, 9) == N.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_explicit_placements():
    facts, state = enabled(A100)
    assert code(state.create_gi, facts, 0, 9, (2, 4)) == N.NVML_ERROR_INVALID_ARGUMENT
    assert code(state.create_gi, facts, 0, 9, (0, 2)) == N.NVML_ERROR_INVALID_ARGUMENT
    state.create_gi(facts, 0, 19, (0, 1))
    assert code(state.create_gi, facts, 0, 9, (0, 4)) == N.NVML_ERROR_INSUFFICIENT_RESOURCES
    gi = state.create_gi(facts, 0, 9, (4, 4))
    assert (gi.id, gi.start, gi.size) == (2, 4, 4)
    assert code(state.create_gi, facts, 0, 99) == N.NVML_ERROR_INVALID_ARGUMENT


def test_gpu_instance_ids_follow_placement():
    assert [gpu_instance_id(s, 1, 8) for s in range(7)] == [7, 8, 9, 10, 11, 12, 13]
    assert [gpu_instance_id(s, 2, 8) for s in (0, 2, 4, 6)] == [3, 4, 5, 6]
    assert [gpu_instance_id(s, 4, 8) for s in (0, 4)] == [1, 2]
    assert gpu_instance_id(0, 8, 8) == 0
    assert [gpu_instance_id(s, 1, 4) for s in range(4)] == [3, 4, 5, 6]


def test_shuffled_gpu_instance_ids_stay_in_their_range_but_leave_the_placement_slot():
    for seed in ("GPU-a", "GPU-b", "GPU-c"):
        for size, starts, ids in ((1, range(8), range(7, 15)), (2, (0, 2, 4, 6), range(3, 7)),
                                  (4, (0, 4), (1, 2)), (8, (0,), (0,))):
            got = [gpu_instance_id(s, size, 8, seed) for s in starts]
            assert sorted(got) == list(ids)
    # Some seed moves some placement off its own slot: the agent cannot predict ids.
    assert any(gpu_instance_id(s, 1, 8, f"GPU-{k}") != gpu_instance_id(s, 1, 8)
               for k in range(4) for s in range(7))


def test_a_gpu_with_shuffled_ids_numbers_the_same_placements_otherwise():
    facts, state = enabled(A100, A100)
    state.gpus[1].gi_ids = "shuffled"
    for index in (0, 1):
        for start in range(7):
            state.create_gi(facts, index, 19, (start, 1))
    ids = [{gi.start: gi.id for gi in gpu.gis} for gpu in state.gpus]
    assert ids[0] == {s: 7 + s for s in range(7)}
    assert ids[1] != ids[0] and set(ids[1].values()) <= set(range(7, 15))


def test_compute_slice_budget_and_instance_counts():
    facts, state = enabled(A100)
    for _ in range(7):
        state.create_gi(facts, 0, 19)
    assert code(state.create_gi, facts, 0, 19) == N.NVML_ERROR_INSUFFICIENT_RESOURCES
    facts, state = enabled(A100)
    state.create_gi(facts, 0, 5)            # 4g: 4 compute slices, memory 0-3
    state.create_gi(facts, 0, 9, (4, 4))    # 3g: 3 more, 7 in all
    assert code(state.create_gi, facts, 0, 19) == N.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_media_extension_is_exclusive():
    facts, state = enabled(A100)
    state.create_gi(facts, 0, 20)           # 1g.5gb+me
    assert code(state.create_gi, facts, 0, 20) == N.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_a30_media_extensions_share_one_jpeg_and_ofa():
    # MIG user guide: "A single 1g (2g) profile can include media extensions"; the A30 has one
    # JPEG decoder and one OFA, so 2g.12gb+me (id 6) and 1g.6gb+me (id 21) exclude each other.
    facts, state = enabled("A30-24GB")
    gi = state.create_gi(facts, 0, 6)
    assert (gi.start, gi.size) == (0, 2)
    assert code(state.create_gi, facts, 0, 21) == N.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert code(state.create_gi, facts, 0, 6) == N.NVML_ERROR_INSUFFICIENT_RESOURCES
    state.create_gi(facts, 0, 5)             # a plain 2g.12gb beside it


def test_destroy_refuses_while_in_use():
    facts, state = enabled(A100)
    gi = state.create_gi(facts, 0, 9)
    ci = state.create_ci(facts, 0, gi.id, 2)
    assert code(state.destroy_gi, 0, gi.id) == N.NVML_ERROR_IN_USE
    state.processes.append(SimProcess(pid=1, gpu=0, gi=gi.id, ci=ci.id))
    assert code(state.destroy_ci, 0, gi.id, ci.id) == N.NVML_ERROR_IN_USE
    state.processes.clear()
    state.destroy_ci(0, gi.id, ci.id)
    state.destroy_gi(0, gi.id)
    assert state.gpus[0].gis == []
    assert code(state.destroy_gi, 0, gi.id) == N.NVML_ERROR_INVALID_ARGUMENT


def test_compute_instances_pack_inside_their_gpu_instance():
    facts, state = enabled(A100)
    gi = state.create_gi(facts, 0, 0)       # 7g
    assert code(state.create_ci, facts, 0, gi.id, 5) == N.NVML_ERROR_NOT_SUPPORTED   # 8 slices
    cis = [state.create_ci(facts, 0, gi.id, 1) for _ in range(3)]                      # 3x 2c
    assert [(c.start, c.size) for c in cis] == [(0, 2), (2, 2), (4, 2)]
    state.create_ci(facts, 0, gi.id, 0)
    assert code(state.create_ci, facts, 0, gi.id, 0) == N.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert len({c.uuid for c in state.gpus[0].gis[0].cis}) == 4


def test_mig_device_indices_are_dense_in_instance_id_order():
    facts, state = enabled(A100)
    late = state.create_gi(facts, 0, 9, (4, 4))          # GI 2
    state.create_ci(facts, 0, late.id, 0, (1, 1))
    assert [(gi.id, ci.id) for gi, ci in state.mig_devices(0).values()] == [(2, 0)]
    assert list(state.mig_devices(0)) == [0]
    early = state.create_gi(facts, 0, 9, (0, 4))         # GI 1, created second, numbered first
    state.create_ci(facts, 0, early.id, 0)
    state.create_ci(facts, 0, early.id, 0)
    assert [(gi.id, ci.id) for gi, ci in state.mig_devices(0).values()] == [(1, 0), (1, 1), (2, 0)]
    state.destroy_ci(0, early.id, 0)                     # the rest move down
    assert [(gi.id, ci.id) for gi, ci in state.mig_devices(0).values()] == [(1, 1), (2, 0)]


def test_disable_refused_while_instances_exist():
    facts, state = enabled(A100)
    state.create_gi(facts, 0, 19)
    assert code(state.set_mig_mode, facts, 0, MIG_DISABLE) == N.NVML_ERROR_IN_USE


def test_reboot_semantics_per_architecture():
    facts, state = enabled(A100, H100)
    state.create_gi(facts, 0, 19)
    state.create_gi(facts, 1, 19)
    state.processes.append(SimProcess(pid=1, gpu=0))
    state.gpus[0].lost = True
    state.reboot(facts)
    a100, h100 = state.gpus
    assert a100.gis == [] and h100.gis == [] and state.processes == []
    assert a100.mig_current == MIG_ENABLE and not a100.lost       # InfoROM keeps it
    assert (h100.mig_current, h100.mig_pending) == (MIG_DISABLE, MIG_DISABLE)


def test_driver_unload_destroys_instances_and_hopper_loses_mig_mode():
    facts, state = enabled(A100, H100, H100)
    for index in range(3):
        gi = state.create_gi(facts, index, 9)
        state.create_ci(facts, index, gi.id, 2)
    state.gpus[0].mig_pending = MIG_DISABLE              # an Ampere change waiting for a reset
    state.unload_driver(facts)
    a100, h100, _ = state.gpus
    assert not state.driver_loaded and all(g.gis == [] for g in state.gpus)
    assert (a100.mig_current, a100.mig_pending) == (MIG_ENABLE, MIG_DISABLE)   # InfoROM
    assert (h100.mig_current, h100.mig_pending) == (MIG_DISABLE, MIG_DISABLE)


def test_driver_unload_is_refused_while_processes_use_gpus():
    facts, state = enabled(H100)
    state.create_gi(facts, 0, 19)
    state.processes.append(SimProcess(pid=1, gpu=0))
    before = state.to_dict()
    assert code(state.unload_driver, facts) == N.NVML_ERROR_IN_USE
    assert state.to_dict() == before


def test_reboot_loads_the_driver():
    facts, state = enabled(A100)
    state.unload_driver(facts)
    state.reboot(facts)
    assert state.driver_loaded and state.gpus[0].mig_current == MIG_ENABLE


def test_lost_gpu_returns_gpu_is_lost():
    facts, state = enabled(A100)
    state.mark_lost(0)
    assert code(state.create_gi, facts, 0, 19) == N.NVML_ERROR_GPU_IS_LOST
    assert state.events[-1].data == 79


# ---- property: any sequence of calls does what the rules say ---------------------------

from tests.unit import sim_oracle as oracle     # noqa: E402

SKUS = [A100, "A100-SXM4-80GB", "A30-24GB", H100, "H200-SXM-141GB"]
OPS = st.lists(st.tuples(
    st.sampled_from(["gi", "gi_at", "ci", "ci_at", "dgi", "dci", "hold", "free"]),
    st.integers(0, 20), st.integers(0, 8), st.integers(0, 8)), max_size=40)


def check_invariants(facts, state):
    for gpu in state.gpus:
        mig = facts.skus[gpu.sku].mig
        used = []
        for gi in gpu.gis:
            prof = mig.by_id(gi.profile_id)
            assert gi.start in prof.placements and gi.size == prof.memory_slices
            assert gi.id == gpu_instance_id(gi.start, gi.size, mig.memory_slices,
                                            gpu.uuid if gpu.gi_ids == "shuffled" else None)
            used += range(gi.start, gi.start + gi.size)
            cslots = []
            for ci in gi.cis:
                cprof = prof.ci_profile(ci.profile_id)
                assert ci.start in cprof.placements and ci.size == cprof.slices
                cslots += range(ci.start, ci.start + ci.size)
            assert len(cslots) == len(set(cslots)) and all(s < prof.slices for s in cslots)
        assert len(used) == len(set(used)), "memory slices overlap"
        profs = [mig.by_id(g.profile_id) for g in gpu.gis]
        assert sum(p.slices for p in profs) <= mig.compute_slices
        for p in set(profs):
            assert profs.count(p) <= p.instances
        slots = list(state.mig_devices(gpu.index))
        assert slots == list(range(sum(len(g.cis) for g in gpu.gis)))


def gis_of(state):
    """GPU 0's instances in the form the oracle takes."""
    return [(gi.id, gi.profile_id, gi.start, gi.size,
             [(ci.id, ci.profile_id, ci.start, ci.size) for ci in gi.cis]) for gi in state.gpus[0].gis]


def instances(state):
    """Every GI and CI of GPU 0, without their own ids (checked by the invariants)."""
    return oracle.instances(gis_of(state))


def step(facts, state, op, a, b, c):
    """The call an op stands for, and what the rules say it must do:
    (function, args, expected code, instances after it if it succeeds); None for no call."""
    gpu = state.gpus[0]
    busy = {(p.gi, p.ci) for p in state.processes_on(0)}
    e = oracle.expect(facts.skus[gpu.sku].mig, gis_of(state), busy, op, a, b, c)
    if e is None:
        return None
    gi = gpu.gis[e.gi] if e.gi is not None else None
    if e.kind == "gi":
        return state.create_gi, (facts, 0, e.profile, e.placement), e.want, e.after
    if e.kind == "ci":
        return state.create_ci, (facts, 0, gi.id, e.profile, e.placement), e.want, e.after
    if e.kind == "dgi":
        return state.destroy_gi, (0, gi.id), e.want, e.after
    return state.destroy_ci, (0, gi.id, gi.cis[e.ci].id), e.want, e.after


@pytest.mark.parametrize("sku", SKUS)
@settings(max_examples=300, deadline=None)
@given(ops=OPS, shuffled=st.booleans())
def test_random_call_sequences_do_what_the_rules_say(sku, ops, shuffled):
    facts, state = enabled(sku)
    if shuffled:
        state.gpus[0].gi_ids = "shuffled"
    for op, a, b, c in ops:
        gpu = state.gpus[0]
        if op == "hold" and gpu.gis and gpu.gis[b % len(gpu.gis)].cis:
            gi = gpu.gis[b % len(gpu.gis)]
            state.processes.append(SimProcess(pid=a, gpu=0, gi=gi.id, ci=gi.cis[0].id))
        elif op == "free":
            state.processes.clear()
        call = step(facts, state, op, a, b, c)
        if call is None:
            continue
        fn, args, want, after = call
        before = state.to_dict()
        try:
            fn(*args)
            got = oracle.SUCCESS
        except SimNvmlError as e:
            got = e.code
        assert got == want, f"{fn.__name__}{args[1:]}: NVML code {got}, the rules say {want}"
        if got == oracle.SUCCESS:
            assert instances(state) == after, f"{fn.__name__}{args[1:]} did not do what the rules say"
        else:
            assert state.to_dict() == before, f"failed {fn.__name__} changed the state"
        check_invariants(facts, state)


def test_the_oracle_itself_agrees_with_the_published_examples():
    mig = catalog.skus()[A100].mig
    # MIG user guide: 19,19,14 then 9 fails; 9,19,14,19 fits; 5,14,19 land at 0:4, 4:2, 6:1.
    assert oracle.gi_create(mig, [(19, 6), (19, 5), (14, 2)], 9) == (oracle.FULL, None)
    assert oracle.gi_create(mig, [(9, 4), (19, 3), (14, 0)], 19) == (oracle.SUCCESS, 2)
    assert oracle.gi_create(mig, [(5, 0), (14, 4)], 19) == (oracle.SUCCESS, 6)
    assert oracle.gi_create(mig, [(20, 0)], 20) == (oracle.FULL, None)
    assert oracle.gi_create(mig, [], 9, (2, 4)) == (oracle.BAD, None)
    assert oracle.ci_create(7, [(1, 0), (1, 2), (1, 4)], 0) == (oracle.SUCCESS, 6)
    assert oracle.ci_create(3, [], 1) == (oracle.SUCCESS, 0)
    assert oracle.ci_create(3, [], 3) == (oracle.UNSUPPORTED, None)
