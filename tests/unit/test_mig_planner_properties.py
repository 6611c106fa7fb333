"""Properties of the planner, checked against the simulator's node model as an independent
oracle of the driver's rules (no NVML, no files):

- any layout the driver can hold, asked for by its device counts, is planned, and the
  planned steps replayed on the driver model from any starting layout reach exactly the
  planned layout, in any order of creation (explicit placements make order irrelevant);
- a set of GPU-instance profiles is planned if and only if an exhaustive search over the
  driver model finds placements for it.
"""

import random

import pynvml as N
from hypothesis import given, settings, strategies as st

from hostagent.devices.records import ComputeInstance, GpuInstance, MigState, Placement
from hostagent.mig.layout import Layout
from hostagent.mig.plan import CREATE_CI, CREATE_GI, DESTROY_CI, DESTROY_GI, SET_MODE
from hostagent.mig.planner import PlanError, plan
from hostagent.mig.spec import ConfigEntry, MigSpec
from hostagent.sim import catalog
from hostagent.sim.node import MIG_ENABLE, NodeFacts, NodeState, SimGpu, SimNvmlError

from .mig_records import A30, A100, A100_80, H100, H200, gpu, inventory

SKUS = (A100, A100_80, A30, H100, H200)


def model(sku: str) -> tuple[NodeFacts, NodeState]:
    facts = NodeFacts(profile="t", driver_version="550.90.07", cuda_driver_version=12040,
                      skus={sku: catalog.skus()[sku]}, real_device_nodes=False, majors={})
    state = NodeState(gpus=[SimGpu(index=0, sku=sku, uuid="GPU-0000", pci_bus_id="0000:01:00.0",
                                   minor=0, serial="0", mig_current=MIG_ENABLE, mig_pending=MIG_ENABLE)])
    return facts, state


def record(sku: str, state: NodeState):
    """The inventory's view of the model's GPU 0."""
    base = gpu(0, sku, enabled=True)
    gis = tuple(GpuInstance(id=g.id, profile_id=g.profile_id,
                            profile=catalog.skus()[sku].mig.by_id(g.profile_id).name,
                            placement=Placement(g.start, g.size),
                            compute_instances=tuple(ComputeInstance(c.id, c.profile_id, c.size,
                                                                    Placement(c.start, c.size))
                                                    for c in g.cis))
                for g in state.gpus[0].gis)
    return base.__class__(**{**base.__dict__, "mig": MigState(True, True, base.mig.profiles, gis)})


OPS = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 8), st.integers(0, 20)), max_size=14)


def build(sku: str, ops) -> NodeState:
    """A random layout the driver accepts: GIs and CIs at random explicit placements."""
    facts, state = model(sku)
    mig = facts.skus[sku].mig
    for a, b, c in ops:
        g = state.gpus[0]
        try:
            if a % 3 and g.gis:
                gi = g.gis[c % len(g.gis)]
                cprofs = mig.by_id(gi.profile_id).ci_profiles
                cp = cprofs[a % len(cprofs)]
                state.create_ci(facts, 0, gi.id, cp.id, (cp.placements[b % len(cp.placements)], cp.slices))
            else:
                prof = mig.gi_profiles[c % len(mig.gi_profiles)]
                state.create_gi(facts, 0, prof.id, (prof.placements[b % len(prof.placements)],
                                                    prof.memory_slices))
        except SimNvmlError:
            pass
    # Every GI gets at least one CI: a GI without any is invisible in device counts.
    for gi in list(state.gpus[0].gis):
        if not gi.cis:
            cp = mig.by_id(gi.profile_id).ci_profiles[-1]
            state.create_ci(facts, 0, gi.id, cp.id, (0, cp.slices))
    return state


def replay(sku: str, state: NodeState, steps, rng: random.Random) -> None:
    """Carry out plan steps on the driver model; creations in a random order."""
    facts, _ = model(sku)
    created = {}
    destroys = [s for s in steps if s.action in (DESTROY_CI, DESTROY_GI)]
    gi_creates = [s for s in steps if s.action == CREATE_GI]
    ci_creates = [s for s in steps if s.action == CREATE_CI]
    assert not [s for s in steps if s.action == SET_MODE]
    assert [s.action for s in destroys] == sorted((s.action for s in destroys), key=[DESTROY_CI, DESTROY_GI].index)
    for s in destroys:
        if s.action == DESTROY_CI:
            state.destroy_ci(0, s.gi_id, s.ci_id)
        else:
            state.destroy_gi(0, s.gi_id)
    rng.shuffle(gi_creates)
    for s in gi_creates:
        created[s.gi.key] = state.create_gi(facts, 0, s.gi.profile_id, (s.gi.start, s.gi.size)).id
    rng.shuffle(ci_creates)
    for s in ci_creates:
        gi_id = s.gi_id if s.gi_id is not None else created[s.gi.key]
        state.create_ci(facts, 0, gi_id, s.ci.profile_id, (s.ci.start, s.ci.slices))


def spec_for(counts: dict[str, int]) -> MigSpec:
    return MigSpec({"t": (ConfigEntry("all", True, tuple(counts.items())),)})


@settings(max_examples=120, deadline=None)
@given(sku=st.sampled_from(SKUS), start=OPS, goal=OPS, seed=st.integers(0, 2**16))
def test_feasible_layouts_plan_and_replay_to_exactly_the_plan(sku, start, goal, seed):
    want = Layout.of(record(sku, build(sku, goal))).counts()
    current = build(sku, start)
    p = plan(inventory(record(sku, current)), spec_for(want))
    g = p.gpus[0]
    assert g.after.counts() == want
    replay(sku, current, g.steps, random.Random(seed))
    assert Layout.of(record(sku, current)) == g.after
    # Minimal disruption: nothing is destroyed when the current layout already fits.
    if Layout.of(record(sku, build(sku, start))).counts() == want:
        assert not g.steps


def oracle_fits(sku: str, names: list[str]) -> bool:
    """Exhaustive search over placements with the driver model."""
    facts, state = model(sku)
    mig = facts.skus[sku].mig
    profs = sorted((next(p for p in mig.gi_profiles if p.name == n) for n in names),
                   key=lambda p: -p.memory_slices)

    def place(i):
        if i == len(profs):
            return True
        p = profs[i]
        for start in p.placements:
            try:
                gi = state.create_gi(facts, 0, p.id, (start, p.memory_slices))
            except SimNvmlError as e:
                assert e.code == N.NVML_ERROR_INSUFFICIENT_RESOURCES
                continue
            if place(i + 1):
                return True
            state.destroy_gi(0, gi.id)
        return False
    return place(0)


@settings(max_examples=150, deadline=None)
@given(sku=st.sampled_from(SKUS), picks=st.lists(st.integers(0, 50), min_size=1, max_size=8))
def test_a_profile_set_is_planned_exactly_when_the_driver_model_can_hold_it(sku, picks):
    names = [p.name for p in catalog.skus()[sku].mig.gi_profiles]
    chosen = [names[i % len(names)] for i in picks]
    counts = {n: chosen.count(n) for n in dict.fromkeys(chosen)}
    fits = oracle_fits(sku, chosen)
    try:
        p = plan(inventory(gpu(0, sku, enabled=True)), spec_for(counts))
    except PlanError as e:
        assert not fits, f"planner rejected a layout the driver accepts: {e.message}"
        assert "cannot fit together" in e.message or "need more than" in e.message
        return
    assert fits, f"planner accepted a layout the driver rejects: {counts}"
    assert p.gpus[0].after.counts() == counts
