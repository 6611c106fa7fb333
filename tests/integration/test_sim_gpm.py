"""The simulator's GPU performance monitoring, NVLink counters and vGPU answers through
pynvml, as nvml.h defines them, with values that follow 'sim load'."""

import time

import pynvml as N
import pytest

from hostagent.devices import nvml_session
from hostagent.errors import UsageError
from hostagent.sim import control, workload
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.workload import Load

GR, SM, OCC, TENSOR, DRAM, FP16 = (N.NVML_GPM_METRIC_GRAPHICS_UTIL, N.NVML_GPM_METRIC_SM_UTIL,
                                   N.NVML_GPM_METRIC_SM_OCCUPANCY, N.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                                   N.NVML_GPM_METRIC_DRAM_BW_UTIL, N.NVML_GPM_METRIC_FP16_UTIL)
PCIE_TX, NVLINK_TX, NVLINK_RX = (N.NVML_GPM_METRIC_PCIE_TX_PER_SEC, N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
                                 N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC)
ALL_LINKS = 0xFFFFFFFF


def metrics(first, second, ids):
    """{metric id: (nvmlReturn, value)} between two samples."""
    request = N.c_nvmlGpmMetricsGet_t()
    request.version = N.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    for i, metric in enumerate(ids):
        request.metrics[i].metricId = metric
    request.sample1, request.sample2 = first, second
    N.nvmlGpmMetricsGet(request)
    return {m.metricId: (m.nvmlReturn, m.value) for m in request.metrics[:len(ids)]}


def span(take, seconds=0.15, between=None):
    """Two samples ``seconds`` apart (``between()`` run halfway)."""
    first, second = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    take(first)
    time.sleep(seconds / 2)
    if between:
        between()
    time.sleep(seconds / 2)
    take(second)
    return first, second


def mig_layout(store, gpu, profile_ids):
    """GPU instances of ``profile_ids`` on ``gpu``, each with one full compute instance."""
    with store.mutate() as s:
        s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
        s.reset_gpu(gpu)
        for pid in profile_ids:
            gi = s.create_gi(store.facts, gpu, pid)
            prof = store.facts.skus[s.gpus[gpu].sku].mig.by_id(pid)
            s.create_ci(store.facts, gpu, gi.id, prof.ci_profiles[-1].id)


def test_support_follows_the_architecture(make_node):
    host, _ = make_node("mixed")                       # two A100 and a T4
    with nvml_session(host):
        for i in range(3):
            h = N.nvmlDeviceGetHandleByIndex(i)
            assert N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
            with pytest.raises(N.NVMLError_NotSupported):
                N.nvmlGpmSampleGet(h, N.nvmlGpmSampleAlloc())
    host, _ = make_node("hgx-h200")
    with nvml_session(host):
        assert N.nvmlGpmQueryDeviceSupport(N.nvmlDeviceGetHandleByIndex(0)).isSupportedDevice == 1


def test_metrics_are_the_load_averaged_over_the_span(make_node):
    host, store = make_node("hgx-h100")
    workload.set_load(store, "2", Load(gr=80, sm=70, occupancy=35, tensor=40, fp16=20, dram=30, pcie_tx=1500,
                                       nvlink_tx=4000, nvlink_rx=1000))
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(2)
        got = metrics(*span(lambda s: N.nvmlGpmSampleGet(h, s)),
                      [GR, SM, OCC, TENSOR, FP16, DRAM, PCIE_TX, NVLINK_TX, NVLINK_RX, N.NVML_GPM_METRIC_FP64_UTIL,
                       N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL, N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL])
        assert {m: round(v, 6) for m, (code, v) in got.items() if code == N.NVML_SUCCESS} == {
            GR: 80, SM: 70, OCC: 35, TENSOR: 40, FP16: 20, DRAM: 30, PCIE_TX: 1500, NVLINK_TX: 4000,
            NVLINK_RX: 1000, N.NVML_GPM_METRIC_FP64_UTIL: 0, N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 40,
            N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0}
        # per link: the traffic split over the H100's 18 links; there is no link 18
        link0_tx, link18_tx = 63, 213
        got = metrics(*span(lambda s: N.nvmlGpmSampleGet(h, s)), [link0_tx, link18_tx])
        assert got[link0_tx] == (N.NVML_SUCCESS, pytest.approx(4000 / 18))
        assert got[link18_tx][0] == N.NVML_ERROR_NOT_SUPPORTED
        # an idle GPU reads 0, not nothing
        idle = N.nvmlDeviceGetHandleByIndex(3)
        assert metrics(*span(lambda s: N.nvmlGpmSampleGet(idle, s)), [SM, PCIE_TX]) == {
            SM: (N.NVML_SUCCESS, 0.0), PCIE_TX: (N.NVML_SUCCESS, 0.0)}


def test_a_load_changed_within_the_span_is_weighted_by_time(make_node):
    host, store = make_node("hgx-h100")
    workload.set_load(store, "0", Load(gr=100, sm=100))
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        changed = []

        def change():
            workload.set_load(store, "0", Load(gr=20, sm=20))
            changed.append(time.time())
        first, second = span(lambda s: N.nvmlGpmSampleGet(h, s), 0.4, change)
        got = metrics(first, second, [SM])[SM][1]
    assert 40 < got < 80                   # about 60: half the span at 100, half at 20


def test_mig_samples_per_instance_and_device(make_node):
    host, store = make_node("hgx-h100")
    mig_layout(store, 0, [9, 19])                      # 3g.40gb (60 SMs) and 1g.10gb (16 SMs)
    state = store.read()
    big, small = state.gpus[0].gis
    workload.set_load(store, "0:0", Load(gr=50, sm=50, dram=40, pcie_rx=800))   # the 3g.40gb's device
    with pytest.raises(UsageError, match="MIG enabled"):
        workload.set_load(store, "0", Load(sm=10, gr=10))
    with pytest.raises(UsageError, match="no NVLink traffic"):
        workload.set_load(store, "0:1", Load(nvlink_tx=10))
    with nvml_session(host):
        gpu = N.nvmlDeviceGetHandleByIndex(0)
        mig0 = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        assert N.nvmlGpmQueryDeviceSupport(mig0).isSupportedDevice == 1
        per_gi = metrics(*span(lambda s: N.nvmlGpmMigSampleGet(gpu, big.id, s)), [SM, DRAM, PCIE_TX])
        assert per_gi[SM] == (N.NVML_SUCCESS, pytest.approx(50))
        assert per_gi[DRAM] == (N.NVML_SUCCESS, pytest.approx(40))
        assert per_gi[PCIE_TX][0] == N.NVML_ERROR_NOT_SUPPORTED        # PCIe and NVLink: the GPU's only
        assert metrics(*span(lambda s: N.nvmlGpmSampleGet(mig0, s)), [SM])[SM][1] == pytest.approx(50)
        assert metrics(*span(lambda s: N.nvmlGpmMigSampleGet(gpu, small.id, s)), [SM])[SM][1] == 0
        # the whole GPU: the instances by SMs (60 of 132), DRAM by memory slices (4 of 8)
        whole = metrics(*span(lambda s: N.nvmlGpmSampleGet(gpu, s)), [SM, DRAM, N.NVML_GPM_METRIC_PCIE_RX_PER_SEC])
        assert whole[SM][1] == pytest.approx(50 * 60 / 132)
        assert whole[DRAM][1] == pytest.approx(40 * 4 / 8)
        assert whole[N.NVML_GPM_METRIC_PCIE_RX_PER_SEC][1] == pytest.approx(800)
        with pytest.raises(N.NVMLError_NotFound):
            N.nvmlGpmMigSampleGet(gpu, 14, N.nvmlGpmSampleAlloc())
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlGpmMigSampleGet(mig0, big.id, N.nvmlGpmSampleAlloc())
        with pytest.raises(N.NVMLError_NotSupported):                  # MIG disabled there
            N.nvmlGpmMigSampleGet(N.nvmlDeviceGetHandleByIndex(1), 1, N.nvmlGpmSampleAlloc())
        # a MIG device destroyed between samples: its handle is refused
        with store.mutate() as s:
            s.destroy_ci(0, small.id, small.cis[0].id)
        mig1 = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        with store.mutate() as s:
            s.destroy_ci(0, big.id, big.cis[0].id)
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlGpmSampleGet(mig1, N.nvmlGpmSampleAlloc())


def test_refusals(make_node):
    host, store = make_node("hgx-h100")
    with nvml_session(host):
        a, b = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
        one, two = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
        N.nvmlGpmSampleGet(a, one)
        N.nvmlGpmSampleGet(b, two)
        with pytest.raises(N.NVMLError_InvalidArgument):       # samples of two devices
            metrics(one, two, [SM])
        with pytest.raises(N.NVMLError_InvalidArgument):       # a sample never taken
            metrics(one, N.nvmlGpmSampleAlloc(), [SM])
        N.nvmlGpmSampleGet(a, two)                             # within one counter refresh (100 ms)
        assert metrics(one, two, [SM])[SM][0] == N.NVML_ERROR_NO_DATA
        time.sleep(0.12)
        N.nvmlGpmSampleGet(a, two)
        got = metrics(one, two, [SM, 14, N.NVML_GPM_METRIC_C2C_TOTAL_TX_PER_SEC])
        assert [got[m][0] for m in (SM, 14, N.NVML_GPM_METRIC_C2C_TOTAL_TX_PER_SEC)] == [
            N.NVML_SUCCESS, N.NVML_ERROR_INVALID_ARGUMENT, N.NVML_ERROR_NOT_SUPPORTED]   # 14: no such id
        request = N.c_nvmlGpmMetricsGet_t()
        request.version, request.numMetrics, request.sample1, request.sample2 = 2, 1, one, two
        with pytest.raises(N.NVMLError) as e:
            N.nvmlGpmMetricsGet(request)
        assert e.value.value == N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        N.nvmlGpmSampleFree(two)
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlGpmSampleFree(two)
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlGpmSampleGet(a, two)
        control.lose_gpu(store, 1)
        with pytest.raises(N.NVMLError_GpuIsLost):
            N.nvmlGpmSampleGet(b, one)


def test_nvlink_counters_grow_with_the_load(make_node):
    host, store = make_node("hgx-h100")
    workload.set_load(store, "1", Load(nvlink_tx=3000, nvlink_rx=600))
    tx, rx = N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    fields = [(tx, ALL_LINKS), (rx, ALL_LINKS), (tx, 0), (tx, 18)]
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(1)
        before = N.nvmlDeviceGetFieldValues(h, fields)
        time.sleep(0.3)
        after = N.nvmlDeviceGetFieldValues(h, fields)
        seconds = (after[0].timestamp - before[0].timestamp) / 1e6
        assert [v.nvmlReturn for v in after] == [N.NVML_SUCCESS] * 3 + [N.NVML_ERROR_NOT_SUPPORTED]  # 18 links
        assert (after[0].value.ullVal - before[0].value.ullVal) / seconds == pytest.approx(3000 * 1024, rel=0.02)
        assert (after[1].value.ullVal - before[1].value.ullVal) / seconds == pytest.approx(600 * 1024, rel=0.02)
        assert after[2].value.ullVal == after[0].value.ullVal // 18
        idle = N.nvmlDeviceGetFieldValues(N.nvmlDeviceGetHandleByIndex(2), fields[:1])[0]
        assert idle.nvmlReturn == N.NVML_SUCCESS and idle.value.ullVal == 0
        control.set_topology_support(store, 3, False)          # NVML tells no links: no counters
        assert N.nvmlDeviceGetFieldValues(N.nvmlDeviceGetHandleByIndex(3), fields[:1])[0].nvmlReturn == \
            N.NVML_ERROR_NOT_SUPPORTED
    host, store = make_node("t4x2")
    with nvml_session(host):
        assert N.nvmlDeviceGetFieldValues(N.nvmlDeviceGetHandleByIndex(0), fields[:1])[0].nvmlReturn == \
            N.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(UsageError, match="has no NVLink"):
        workload.set_load(store, "0", Load(nvlink_rx=1))


def test_loads_are_checked_and_end_with_a_reboot(make_node):
    host, store = make_node("hgx-h100")
    for bad, why in ((Load(sm=50, gr=40), "more than --gr"), (Load(gr=90, sm=90, tensor=95), "more than --sm"),
                     (Load(dram=120), "not a percentage"), (Load(pcie_tx=10 ** 6), "PCIe Gen5 x16")):
        with pytest.raises(UsageError, match=why):
            workload.set_load(store, "0", bad)
    workload.set_load(store, "0", Load(gr=10, sm=10))
    assert store.read().loads
    control.reboot(store)
    assert not store.read().loads


def test_a_vgpu_guest_reports_its_licence(make_node):
    host, store = make_node("dgx-a100")
    with store.mutate() as s:
        s.gpus[0].vgpu_license, s.gpus[1].vgpu_license = "licensed", "unlicensed"
    with nvml_session(host):
        answers = []
        for i in range(3):
            h = N.nvmlDeviceGetHandleByIndex(i)
            features = N.nvmlDeviceGetGridLicensableFeatures_v4(h)
            listed = features.gridLicensableFeatures[:features.licensableFeaturesCount]
            states = [(f.featureCode, f.featureState) for f in listed]
            answers.append((N.nvmlDeviceGetVirtualizationMode(h), features.isGridLicenseSupported, states))
    vgpu = N.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
    assert answers == [(N.NVML_GPU_VIRTUALIZATION_MODE_VGPU, 1, [(vgpu, 1)]),
                       (N.NVML_GPU_VIRTUALIZATION_MODE_VGPU, 1, [(vgpu, 0)]),
                       (N.NVML_GPU_VIRTUALIZATION_MODE_NONE, 0, [])]
