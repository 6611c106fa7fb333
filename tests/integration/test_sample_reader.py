"""The sampler's NVML reads on simulated nodes: what a sample holds is what pynvml's own
wrappers answer, and a driver that refuses a field or lacks a function costs that value
only (the counter comes from its function instead, or the value is absent)."""

import ctypes
import time

import pynvml as N
import pytest

from hostagent.devices import nvml_session, read_inventory
from hostagent.devices.queries import call
from hostagent.devices.samples import SampleReader

from .test_metrics_exposition import mig_sevens

MIB = 1 << 20
ENERGY, REPLAYS = N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, N.NVML_FI_DEV_PCIE_REPLAY_COUNTER


@pytest.fixture
def patched():
    """Replace a function of the simulated library for one test: ``patch(name, fn(real, *args))``."""
    undo = []

    def patch(name, fn, argtypes):
        lib = N.nvmlLib
        real = getattr(lib, name)
        setattr(lib, name, ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(lambda *args: fn(real, *args)))
        N._nvmlGetFunctionPointer_cache.pop(name, None)
        undo.append((lib, name, real))
    yield patch
    for lib, name, real in undo:
        setattr(lib, name, real)
        N._nvmlGetFunctionPointer_cache.pop(name, None)


def test_a_sample_holds_what_pynvml_answers(make_node):
    host, store = make_node("hgx-h100")
    mig_sevens(store, [1])
    inv = read_inventory(host)
    with nvml_session(host):
        reader = SampleReader(inv)
        h = N.nvmlDeviceGetHandleByIndex(0)
        energy_before = N.nvmlDeviceGetTotalEnergyConsumption(h)
        sample = reader.read()
        energy_after = N.nvmlDeviceGetTotalEnergyConsumption(h)
        gpu = sample.gpus[0]
        mem = N.nvmlDeviceGetMemoryInfo(h, N.nvmlMemory_v2)
        assert gpu.memory == (mem.total // MIB, mem.used // MIB, mem.free // MIB, mem.reserved // MIB)
        temp = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_MEMORY_TEMP])[0].value.uiVal
        assert abs(gpu.memory_temp_c - temp) <= 1                   # a sensor that wanders slowly
        assert energy_before <= gpu.energy_mj <= energy_after
        assert gpu.pcie_replays == N.nvmlDeviceGetPcieReplayCounter(h)
        assert gpu.sm_clock_mhz == N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)
        # GPU instances: memory through their first MIG device, seven of them
        assert [i.gi for i in sample.instances] == sorted(gi.id for gi in inv.gpus[1].mig.gpu_instances)
        parent = N.nvmlDeviceGetHandleByIndex(1)
        for index, inst in enumerate(sample.instances):
            mem = N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetMigDeviceHandleByIndex(parent, index), N.nvmlMemory_v2)
            assert inst.memory == (mem.total // MIB, mem.used // MIB, mem.free // MIB, mem.reserved // MIB)
        time.sleep(0.12)
        sample = reader.read()                                      # GPM: the second sample has metrics
        assert sample.gpm_complete and not sample.pending
        assert sample.instances[0].gpm.sm == 0.0 and sample.instances[0].gpm.pcie_tx is None
        assert sample.gpus[0].gpm.pcie_tx == 0.0
        reader.close()


def test_refused_energy_and_replay_fields_come_from_their_functions(make_node, patched):
    host, store = make_node("dgx-a100")
    inv = read_inventory(host)

    def refuse(real, handle, count, values):
        ret = real(handle, count, values)
        for i in range(count):
            fv = N.c_nvmlFieldValue_t.from_address(values + i * ctypes.sizeof(N.c_nvmlFieldValue_t))
            if fv.fieldId in (ENERGY, REPLAYS):
                fv.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
        return ret
    with nvml_session(host):
        patched("nvmlDeviceGetFieldValues", refuse, (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p))
        lib = N.nvmlLib
        reader = SampleReader(inv)
        for _ in range(2):
            before = lib.calls["nvmlDeviceGetTotalEnergyConsumption"], lib.calls["nvmlDeviceGetPcieReplayCounter"]
            sample = reader.read()
            assert all(g.energy_mj > 0 and g.pcie_replays is not None for g in sample.gpus)
            assert all(g.memory_temp_c is not None for g in sample.gpus)     # the other fields stay
            after = lib.calls["nvmlDeviceGetTotalEnergyConsumption"], lib.calls["nvmlDeviceGetPcieReplayCounter"]
            assert [a - b for a, b in zip(after, before)] == [8, 8]
        reader.close()


def test_a_failed_field_call_leaves_the_counters_to_their_functions(make_node, patched):
    host, store = make_node("t4x2")
    inv = read_inventory(host)
    with nvml_session(host):
        patched("nvmlDeviceGetFieldValues", lambda real, *args: N.NVML_ERROR_UNKNOWN,
                (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p))
        reader = SampleReader(inv)
        sample = reader.read()
        assert all(g.energy_mj > 0 and g.pcie_replays is not None for g in sample.gpus)
        reader.close()


@pytest.mark.allow_missing_nvml
def test_a_function_the_library_lacks(make_node):
    host, store = make_node("hgx-h100")
    mig_sevens(store, [0])
    inv = read_inventory(host)
    with nvml_session(host):
        assert call("nvmlNoSuchFunction") == N.NVML_ERROR_FUNCTION_NOT_FOUND
        lib = N.nvmlLib
        real = lib.nvmlGpmMigSampleGet
        del lib.nvmlGpmMigSampleGet                  # an older library: no MIG samples
        N._nvmlGetFunctionPointer_cache.pop("nvmlGpmMigSampleGet", None)
        try:
            reader = SampleReader(inv)
            sample = reader.read()
        finally:
            lib.nvmlGpmMigSampleGet = real
            N._nvmlGetFunctionPointer_cache.pop("nvmlGpmMigSampleGet", None)
        assert all(i.gpm is None and i.memory is not None for i in sample.instances)
        assert sample.gpus[0].gpu_temp_c is not None and not sample.gpm_complete
        reader.close()
