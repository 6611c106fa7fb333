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

# (node profile, GPU): A100-40GB, A100-80GB (the mixed node's first GPU), A30, H200 (the
# second GPU: its instance ids do not follow their placements).
CASES = [("dgx-a100", 0), ("mixed", 0), ("a30x4", 0), ("hgx-h200", 1)]
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


def described(gis):
    """What ``read_back`` found, in the form the oracle takes."""
    return [(info.id, info.profileId, info.placement.start, info.placement.size,
             [(c.id, c.profileId, c.placement.start, c.placement.size) for _, c in cis])
            for _, info, cis in gis]


def signature(gis):
    return oracle.instances(described(gis))


def mig_devices(h):
    """(GI id, CI id) of each MIG device, by MIG device index, through NVML only; checks
    that every index NVML names for a device (nvmlDeviceGetIndex) leads back to it."""
    found = {}
    for i in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except N.NVMLError_NotFound:
            continue
        assert N.nvmlDeviceGetIndex(m) == i
        found[i] = (N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m))
    return found


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
            # MIG devices are numbered densely, in GPU then compute instance id order.
            devices = mig_devices(h)
            assert devices == dict(enumerate(sorted((g.id, c.id) for _, g, cis in gis for _, c in cis)))
            if op == "hold" and gis and gis[b % len(gis)][2]:
                gi = gis[b % len(gis)]
                held = next(i for i, ids in devices.items() if ids == (gi[1].id, gi[2][0][1].id))
                control.hold(store, N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(h, held)),
                             pid=os.getpid())
                continue
            if op == "free":
                control.release(store)
                continue
            busy = {(p.gi, p.ci) for p in store.read().processes if p.gpu == index}
            e = oracle.expect(mig, described(gis), busy, op, a, b, c)
            if e is None:
                continue
            gi = gis[e.gi][0] if e.gi is not None else None
            if e.kind == "gi":
                if e.placement is None:
                    call = lambda: N.nvmlDeviceCreateGpuInstance(h, e.profile)
                else:
                    pl = N.c_nvmlGpuInstancePlacement_t(*e.placement)
                    call = lambda: N.nvmlDeviceCreateGpuInstanceWithPlacement(h, e.profile, ctypes.byref(pl))
            elif e.kind == "ci":
                if e.placement is None:
                    call = lambda: N.nvmlGpuInstanceCreateComputeInstance(gi, e.profile)
                else:
                    pl = N.c_nvmlComputeInstancePlacement_t(*e.placement)
                    call = lambda: N.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, e.profile, ctypes.byref(pl))
            elif e.kind == "dgi":
                call = lambda: N.nvmlGpuInstanceDestroy(gi)
            else:
                ci = gis[e.gi][2][e.ci][0]
                call = lambda: N.nvmlComputeInstanceDestroy(ci)
            got = code_of(call)
            assert got == e.want, f"{op} {a, b, c}: NVML code {got}, the rules say {e.want}"
            assert signature(read_back(h, mig)) == (e.after if got == N.NVML_SUCCESS else now)
    finally:
        N.nvmlShutdown()
