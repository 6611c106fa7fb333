"""The simulator's MIG rules through pynvml, as hostagent calls them: random sequences of
GPU and compute instance creates and destroys on a simulated node on disk, each checked
against the rules stated independently in tests/unit/sim_oracle.py, with the instances read
back through NVML after every call."""

import ctypes
import os

import pynvml as N
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostagent.sim import control, fakenvml
from hostagent.sim.driverroot import create_node
from hostagent.sim.node import MIG_ENABLE
from tests.unit import sim_oracle as oracle

# (node profile, GPU): A100-40GB, A100-80GB (the mixed node's first GPU), A30, H200.
CASES = [("dgx-a100", 0), ("mixed", 0), ("a30x4", 0), ("hgx-h200", 0)]
OPS = st.lists(st.tuples(st.sampled_from(["gi", "gi_at", "ci", "ci_at", "dgi", "dci", "hold", "free"]),
                         st.integers(0, 20), st.integers(0, 8), st.integers(0, 8)), max_size=25)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    stores = {}
    for profile, _ in CASES:
        stores[profile] = create_node(tmp_path_factory.mktemp(profile), profile)
    yield stores
    fakenvml.uninstall()


def read_back(h, mig):
    """[(gi handle, gi info, [(ci handle, ci info)])] of the GPU, through NVML only."""
    out = []
    for prof in mig.gi_profiles:
        count = ctypes.c_uint(0)
        array = (N.c_nvmlGpuInstance_t * prof.instances)()
        N.nvmlDeviceGetGpuInstances(h, prof.id, array, ctypes.byref(count))
        for gi in array[:count.value]:
            cis = []
            for pid in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, pid, 0)
                except N.NVMLError_NotSupported:
                    continue
                ccount = ctypes.c_uint(0)
                carray = (N.c_nvmlComputeInstance_t * info.instanceCount)()
                N.nvmlGpuInstanceGetComputeInstances(gi, pid, carray, ctypes.byref(ccount))
                cis += [(ci, N.nvmlComputeInstanceGetInfo(ci)) for ci in carray[:ccount.value]]
            out.append((gi, N.nvmlGpuInstanceGetInfo(gi), cis))
    return sorted(out, key=lambda g: g[1].id)


def signature(gis):
    out = set()
    for _, info, cis in gis:
        out.add(("gi", info.profileId, info.placement.start, info.placement.size))
        out.update(("ci", info.id, c.profileId, c.placement.start, c.placement.size) for _, c in cis)
    return out


def code_of(call):
    try:
        call()
        return N.NVML_SUCCESS
    except N.NVMLError as e:
        return e.value


@pytest.mark.parametrize("profile, index", CASES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_nvml_call_sequences_do_what_the_rules_say(nodes, profile, index, ops):
    store = nodes[profile]
    with store.mutate() as s:            # each example starts from an empty MIG-enabled GPU
        s.processes.clear()
        gpu = s.gpus[index]
        gpu.gis.clear()
        gpu.mig_current = gpu.mig_pending = MIG_ENABLE
    mig = store.facts.skus[store.read().gpus[index].sku].mig
    fakenvml.install(store.root)
    N.nvmlInit()
    try:
        h = N.nvmlDeviceGetHandleByIndex(index)
        for op, a, b, c in ops:
            gis = read_back(h, mig)
            now = signature(gis)
            gi = gis[b % len(gis)] if gis else None
            busy = {(p.gi, p.ci) for p in store.read().processes}
            if op == "hold" and gi and gi[2]:
                control.hold(store, N.nvmlDeviceGetUUID(
                    N.nvmlDeviceGetMigDeviceHandleByIndex(h, gi[1].placement.start + gi[2][0][1].placement.start)),
                    pid=os.getpid())
                continue
            if op == "free":
                control.release(store)
                continue
            if op in ("gi", "gi_at"):
                prof = mig.gi_profiles[a % len(mig.gi_profiles)]
                placement = None
                if op == "gi_at":
                    placement = ((prof.placements[b % len(prof.placements)], prof.memory_slices)
                                 if c % 4 else (b, c))
                want, start = oracle.gi_create(mig, [(g.profileId, g.placement.start) for _, g, _ in gis],
                                               prof.id, placement)
                after = now | {("gi", prof.id, start, prof.memory_slices)}
                if placement is None:
                    call = lambda: N.nvmlDeviceCreateGpuInstance(h, prof.id)
                else:
                    pl = N.c_nvmlGpuInstancePlacement_t(*placement)
                    call = lambda: N.nvmlDeviceCreateGpuInstanceWithPlacement(h, prof.id, ctypes.byref(pl))
            elif gi is None:
                continue
            elif op in ("ci", "ci_at"):
                pid = a % N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
                size = oracle.CI_SLICES.get(pid, 1)
                placement = ((size * (c % 7), size) if c % 4 else (c, b)) if op == "ci_at" else None
                gslices = next(p.slices for p in mig.gi_profiles if p.id == gi[1].profileId)
                want, start = oracle.ci_create(gslices, [(ci.profileId, ci.placement.start) for _, ci in gi[2]],
                                               pid, placement)
                after = now | {("ci", gi[1].id, pid, start, size)}
                if placement is None:
                    call = lambda: N.nvmlGpuInstanceCreateComputeInstance(gi[0], pid)
                else:
                    pl = N.c_nvmlComputeInstancePlacement_t(*placement)
                    call = lambda: N.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi[0], pid, ctypes.byref(pl))
            elif op == "dgi":
                want = oracle.destroy(bool(gi[2]), any(g == gi[1].id for g, _ in busy))
                after = now - {("gi", gi[1].profileId, gi[1].placement.start, gi[1].placement.size)}
                call = lambda: N.nvmlGpuInstanceDestroy(gi[0])
            elif op == "dci" and gi[2]:
                ci, info = gi[2][c % len(gi[2])]
                want = oracle.destroy(False, (gi[1].id, info.id) in busy)
                after = now - {("ci", gi[1].id, info.profileId, info.placement.start, info.placement.size)}
                call = lambda: N.nvmlComputeInstanceDestroy(ci)
            else:
                continue
            got = code_of(call)
            assert got == want, f"{op} {a, b, c}: NVML code {got}, the rules say {want}"
            assert signature(read_back(h, mig)) == (after if got == N.NVML_SUCCESS else now)
    finally:
        N.nvmlShutdown()
