"""Random layouts through the whole stack (planner, executor, pynvml, simulated driver):
a feasible one is applied to exactly the planned layout with exactly the planned number of
NVML creates and destroys; an infeasible one is rejected with the node untouched."""

import pynvml as N
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from hostagent.devices import read_inventory
from hostagent.mig import service
from hostagent.mig.layout import Layout
from hostagent.mig.planner import PlanError
from hostagent.mig.spec import ConfigEntry, MigSpec
from tests.rootneeds import GPU_CHANGES

from ..unit.mig_records import A30, A100, A100_80, H100, H200
from ..unit.test_mig_planner_properties import OPS, build, oracle_fits, record
from .test_mig_apply import CALLS, cap_minors, expected_minors

# GPU 0 of each simulated MIG node (the mixed node's is an A100-80GB beside a T4).
NODES = {"dgx-a100": A100, "hgx-h100": H100, "hgx-h200": H200, "a30x4": A30, "mixed": A100_80}
_nodes: dict = {}


def node(make_node, profile):
    if profile not in _nodes:        # one node per profile for all examples: each starts
        _nodes[profile] = make_node(profile)[0]     # from the previous example's layout
    return _nodes[profile]


def on_gpu0(counts) -> MigSpec:
    return MigSpec({"t": (ConfigEntry((0,), True, tuple(counts.items())),)})


# About ten examples per node; each starts from the layout the previous one left.
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@GPU_CHANGES
@SETTINGS
@given(profile=st.sampled_from(sorted(NODES)), goal=OPS)
def test_random_feasible_layouts_apply_to_exactly_the_plan(make_node, profile, goal):
    host = node(make_node, profile)
    want = Layout.of(record(NODES[profile], build(NODES[profile], goal))).counts()
    spec = on_gpu0(want)
    plan, _ = service.plan(host, spec, "t")
    before = dict(N.nvmlLib.calls)
    service.apply(host, spec, "t")
    made = {a: N.nvmlLib.calls[f] - before.get(f, 0) for a, f in CALLS.items()}
    assert made == {a: plan.gpus[0].count(a) for a in CALLS}
    gpu0 = read_inventory(host).gpus[0]
    assert Layout.of(gpu0) == plan.gpus[0].after and Layout.of(gpu0).counts() == want
    assert cap_minors(host) == expected_minors(host)


@SETTINGS
@given(profile=st.sampled_from(sorted(NODES)), picks=st.lists(st.integers(0, 50), min_size=2, max_size=8))
def test_random_infeasible_layouts_are_rejected_with_nothing_changed(make_node, profile, picks):
    host = node(make_node, profile)
    sku = NODES[profile]
    names = [p.name for p in read_inventory(host).gpus[0].mig.profiles]
    chosen = [names[i % len(names)] for i in picks]
    assume(not oracle_fits(sku, chosen))          # only infeasible sets are of interest here
    state = (host.root / ".sim/state.json").read_text()
    counts = {n: chosen.count(n) for n in dict.fromkeys(chosen)}
    try:
        service.apply(host, on_gpu0(counts), "t")
    except PlanError as e:
        assert "nothing was changed" in e.message
    else:
        raise AssertionError(f"an infeasible layout was applied: {counts}")
    assert (host.root / ".sim/state.json").read_text() == state
