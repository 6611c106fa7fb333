"""The simulator's telemetry through pynvml: NVML's signatures, units and refusals."""

import time

import pynvml as N
import pytest

from hostagent.devices import nvml_session
from hostagent.sim import control
from hostagent.sim.node import MIG_ENABLE


def mig_layout(store, gpu, profile_id=19, count=1):
    with store.mutate() as s:
        s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
        s.reset_gpu(gpu)
        for _ in range(count):
            gi = s.create_gi(store.facts, gpu, profile_id)
            s.create_ci(store.facts, gpu, gi.id, 0)


def test_idle_then_held_gpu(make_node):
    host, store = make_node("dgx-a100")
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        idle = N.nvmlDeviceGetUtilizationRates(h)
        idle_power = N.nvmlDeviceGetPowerUsage(h)
        assert (idle.gpu, idle.memory) == (0, 0)
        assert N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM) == 210
        assert 0.1 * 400_000 < idle_power < 0.25 * 400_000           # mW, A100 limit 400 W
        assert 20 <= N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU) <= 40
        control.hold(store, "0", used_mib=3000)
        try:
            busy = N.nvmlDeviceGetUtilizationRates(h)
            assert 50 <= busy.gpu <= 100 and 0 < busy.memory <= busy.gpu
            assert N.nvmlDeviceGetPowerUsage(h) > idle_power
            assert N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM) > 1000
            mem = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
            assert mem.used == 3000 << 20 and mem.total == mem.used + mem.free + mem.reserved
        finally:
            control.release(store)


def test_energy_is_monotonic_and_follows_power(make_node):
    host, _ = make_node("t4x2")
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(1)
        e0 = N.nvmlDeviceGetTotalEnergyConsumption(h)
        t0 = time.time()
        time.sleep(0.3)
        e1 = N.nvmlDeviceGetTotalEnergyConsumption(h)
        power = N.nvmlDeviceGetPowerUsage(h)
        assert e1 > e0
        assert (e1 - e0) / (time.time() - t0) == pytest.approx(power, rel=0.5)   # mJ/s = mW


def test_memory_temperature_field(make_node):
    host, _ = make_node("mixed")                # two A100 (HBM) and a T4 (GDDR6)
    with nvml_session(host):
        hbm, gddr = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(2)
        v = N.nvmlDeviceGetFieldValues(hbm, [N.NVML_FI_DEV_MEMORY_TEMP])[0]
        assert v.nvmlReturn == N.NVML_SUCCESS and v.valueType == N.NVML_VALUE_TYPE_UNSIGNED_INT
        assert v.value.uiVal > N.nvmlDeviceGetTemperature(hbm, N.NVML_TEMPERATURE_GPU)
        assert N.nvmlDeviceGetFieldValues(gddr, [N.NVML_FI_DEV_MEMORY_TEMP])[0].nvmlReturn == \
            N.NVML_ERROR_NOT_SUPPORTED
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetRemappedRows(gddr)          # Turing: no row remapping
        assert N.nvmlDeviceGetRemappedRows(hbm)[1:] == (0, 0, 0)


def test_energy_and_replay_fields_are_the_counters_their_functions_read(make_node):
    host, store = make_node("dgx-a100")
    mig_layout(store, 1)
    fields = [N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, N.NVML_FI_DEV_PCIE_REPLAY_COUNTER]
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        e0 = N.nvmlDeviceGetTotalEnergyConsumption(h)
        energy, replays = N.nvmlDeviceGetFieldValues(h, fields)
        e1 = N.nvmlDeviceGetTotalEnergyConsumption(h)
        assert energy.nvmlReturn == replays.nvmlReturn == N.NVML_SUCCESS
        assert energy.valueType == N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        assert e0 <= energy.value.ullVal <= e1                 # one counter, read in turn
        assert replays.value.uiVal == N.nvmlDeviceGetPcieReplayCounter(h)
        # a MIG device refuses them, as it refuses the functions
        m = N.nvmlDeviceGetMigDeviceHandleByIndex(N.nvmlDeviceGetHandleByIndex(1), 0)
        assert [v.nvmlReturn for v in N.nvmlDeviceGetFieldValues(m, fields)] == [N.NVML_ERROR_NOT_SUPPORTED] * 2


def test_mig_refusals(make_node):
    host, store = make_node("dgx-a100")
    mig_layout(store, 0)
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)       # the one 1g.5gb
        for call in (N.nvmlDeviceGetUtilizationRates, N.nvmlDeviceGetEncoderUtilization):
            with pytest.raises(N.NVMLError_NotSupported):
                call(h)                                       # MIG enabled: not on the parent
            with pytest.raises(N.NVMLError_NotSupported):
                call(m)
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetRemappedRows(h)                    # instances are active
        for call in (N.nvmlDeviceGetPowerUsage, N.nvmlDeviceGetTotalEnergyConsumption,
                     N.nvmlDeviceGetPcieReplayCounter):
            with pytest.raises(N.NVMLError_NotSupported):
                call(m)
        assert N.nvmlDeviceGetPowerUsage(h) > 0               # the parent still reports
        mem = N.nvmlDeviceGetMemoryInfo(m, version=N.nvmlMemory_v2)
        assert mem.total == 4864 << 20 and mem.reserved == 0


def test_event_registration_can_be_refused(make_node):
    host, store = make_node("t4x2")
    control.set_event_support(store, 1, False)
    with nvml_session(host):
        es = N.nvmlEventSetCreate()
        try:
            h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
            xid = N.nvmlEventTypeXidCriticalError
            assert N.nvmlDeviceGetSupportedEventTypes(h1) & xid      # the mask does not tell
            N.nvmlDeviceRegisterEvents(h0, xid, es)
            with pytest.raises(N.NVMLError_NotSupported):
                N.nvmlDeviceRegisterEvents(h1, xid, es)
        finally:
            N.nvmlEventSetFree(es)


def test_event_sets_keep_their_identity(make_node):
    """Freeing one set leaves the others intact (handles are not reused while in use)."""
    host, store = make_node("t4x2")
    with nvml_session(host):
        a, b = N.nvmlEventSetCreate(), N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, b)
        N.nvmlEventSetFree(a)
        c = N.nvmlEventSetCreate()
        control.inject_xid(store, 0, 48)
        assert N.nvmlEventSetWait_v2(b, 1000).eventData == 48
        with pytest.raises(N.NVMLError_Timeout):
            N.nvmlEventSetWait_v2(c, 50)                     # c registered nothing
        N.nvmlEventSetFree(b)
        N.nvmlEventSetFree(c)
