"""The placement search is bounded by the GPU's size, never by the request's: requests
that cannot fit are refused by capacity before any search, every search counts its steps
in a Budget (so the bound is asserted as work done, not as time), and a spent or stopped
budget ends the search with SearchAborted."""

import pytest
from hypothesis import given, settings, strategies as st

from hostagent.mig.planner import PlanError, plan
from hostagent.mig.profiles import ci_shapes
from hostagent.mig.solver import Budget, Geometry, Infeasible, SearchAborted, solve
from hostagent.mig.spec import parse_spec

from .mig_records import A30, A100, A100_80, H100, H200, gpu, inventory, profiles

SKUS = (A100, A100_80, A30, H100, H200)
# Far above what any feasible layout needs (a few hundred steps): a search that grows with
# the request would pass it within a few dozen instances.
MAX_STEPS = 20_000


def geometry(sku):
    return Geometry.of(profiles(sku))


def outcome(geo, request, budget):
    try:
        return solve(geo, request, budget=budget)
    except Infeasible as e:
        return e


@pytest.mark.parametrize("sku", SKUS)
@pytest.mark.parametrize("count", [8, 22, 300])
def test_more_instances_of_one_profile_than_fit_are_refused_without_searching(sku, count):
    geo = geometry(sku)
    for p in geo.profiles:
        for shape in ci_shapes(p.slices):
            budget = Budget()
            result = outcome(geo, {p.id: [shape.slices] * (count * p.instances)}, budget)
            assert isinstance(result, Infeasible), (p.name, shape.slices)
            assert f"the {p.instances} {p.name} GPU instance" in str(result)
            assert budget.steps == 0, "refused by capacity, before any search"


@pytest.mark.parametrize("sku", SKUS)
def test_every_profile_at_its_limit_together_is_refused_by_capacity(sku):
    geo = geometry(sku)
    request = {p.id: [p.slices] * p.instances for p in geo.profiles}
    budget = Budget()
    result = outcome(geo, request, budget)
    assert isinstance(result, Infeasible)
    assert "cannot fit together" in str(result)
    assert budget.steps == 0


REQUESTS = st.sampled_from(SKUS).flatmap(lambda sku: st.tuples(st.just(sku), st.dictionaries(
    st.sampled_from([p.id for p in profiles(sku)]), st.lists(st.sampled_from([1, 2, 3, 4, 7, 8]),
                                                             max_size=40), max_size=6)))


@settings(max_examples=150, deadline=None)
@given(REQUESTS)
def test_any_request_ends_within_a_bounded_number_of_steps(case):
    sku, raw = case
    geo = geometry(sku)
    # Only compute-instance sizes the profile offers (others are refused by name earlier).
    request = {pid: [c for c in sizes if c in {s.slices for s in ci_shapes(geo.profile(pid).slices)}]
               for pid, sizes in raw.items()}
    budget = Budget()
    result = outcome(geo, request, budget)
    assert budget.steps <= MAX_STEPS
    if not isinstance(result, Infeasible):
        used = [gi.profile_id for gi in result]
        for pid, sizes in request.items():
            got = sorted(c.slices for gi in result if gi.profile_id == pid for c in gi.cis)
            assert got == sorted(sizes)
        assert len(used) == len(result)


def test_a_spent_budget_aborts_the_search():
    geo = geometry(A100)
    ids = {p.name: p.id for p in geo.profiles}
    request = {ids["1g.5gb"]: [1, 1], ids["2g.10gb"]: [2], ids["3g.20gb"]: [1, 1, 1]}
    assert solve(geo, request, budget=Budget(60.0))                 # feasible with time to spare
    with pytest.raises(SearchAborted, match="budget"):
        solve(geo, request, budget=Budget(0.0))


def test_a_stop_request_aborts_the_search():
    geo = geometry(H100)
    ids = {p.name: p.id for p in geo.profiles}
    with pytest.raises(SearchAborted, match="shutting down"):
        solve(geo, {ids["1g.10gb"]: [1] * 3}, budget=Budget(stop_requested=lambda: True))


def test_the_planner_refuses_an_oversized_request_naming_the_limit():
    spec = parse_spec('version: v1\nmig-configs:\n  big:\n    - devices: all\n      mig-enabled: true\n'
                      '      mig-devices: {"1g.5gb": 300, "1c.3g.20gb": 500}\n')
    with pytest.raises(PlanError) as e:
        plan(inventory(gpu(0, A100, enabled=True), gpu(1, A100)), spec)
    assert "GPU 0, 1" in e.value.what
    assert "300x 1g.5gb need more than the 7 1g.5gb GPU instances" in e.value.what


def test_a_count_far_beyond_the_gpu_is_refused_before_building_anything():
    # A billion instances would need gigabytes as a list of compute instances.
    spec = parse_spec('version: v1\nmig-configs:\n  big:\n    - devices: all\n      mig-enabled: true\n'
                      '      mig-devices: {"1c.3g.20gb": 1000000000}\n')
    with pytest.raises(PlanError, match="1000000000x 1c.3g.20gb need more than the 2 3g.20gb GPU instances"):
        plan(inventory(gpu(0, A100, enabled=True)), spec)
