"""Profiling metrics (DCGM_FI_PROF_* from GPM), NVLink bandwidth and the vGPU licence on the
metrics page of simulated nodes: dcgm-exporter's names, types and help, values that follow
'sim load', per GPU or per GPU instance, and absent (never 0) where NVML cannot give them."""

import time

import pynvml as N
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostagent.devices import read_inventory
from hostagent.metrics import MetricsOptions, MetricsService
from hostagent.metrics.families import INSTANCE_PROF_FAMILIES, PROF_FAMILIES
from hostagent.sim import workload
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.workload import Load

MIB = 1 << 20
# dcgm-exporter's etc/default-counters.csv (the commented-out lines included): type, help.
DCGM_EXPORTER = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gauge", "The ratio of number of warps resident on an SM."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active sending or "
                                          "receiving data."),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("gauge", "Ratio of cycles the fp64 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("gauge", "Ratio of cycles the fp32 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("gauge", "Ratio of cycles the fp16 pipes are active."),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", "The rate of data transmitted over the PCIe bus - including both "
                                            "protocol headers and data payloads - in bytes per second."),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", "The rate of data received over the PCIe bus - including both "
                                            "protocol headers and data payloads - in bytes per second."),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("counter", "Total number of NVLink bandwidth counters for all lanes."),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "vGPU License status"),
}


def parse(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(fams, name, **match):
    return [s.value for s in fams[name].samples if all(s.labels.get(k) == v for k, v in match.items())]


@pytest.fixture
def service(make_node):
    started = []

    def start(profile, prepare=None, **options):
        host, store = make_node(profile)
        if prepare:
            prepare(store)
        svc = MetricsService(host, read_inventory(host),
                             MetricsOptions(port=None, interval=3600, hostname="node-1", **options))
        svc.start()                      # the first page has the rates: start waits for their second read
        started.append(svc)
        return store, svc
    yield start
    for svc in started:
        svc.stop()


def test_profiling_series_follow_the_load_under_dcgm_exporter_names(service):
    load = Load(gr=80, sm=70, occupancy=30, tensor=40, fp64=5, fp32=25, fp16=10, dram=30,
                pcie_tx=1000, pcie_rx=250, nvlink_tx=4000, nvlink_rx=2000)
    store, svc = service("hgx-h100", lambda st: workload.set_load(st, "1", load))
    text = svc.render().decode()
    fams = parse(text)
    for name, (kind, help_text) in DCGM_EXPORTER.items():
        if name != "DCGM_FI_DEV_VGPU_LICENSE_STATUS":
            assert fams[name].type == kind and fams[name].documentation == help_text, name
            assert len(fams[name].samples) == 8, name
    assert "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n" in text      # as dcgm-exporter, no _total
    ratios = {"GR_ENGINE_ACTIVE": 0.8, "SM_ACTIVE": 0.7, "SM_OCCUPANCY": 0.3, "PIPE_TENSOR_ACTIVE": 0.4,
              "PIPE_FP64_ACTIVE": 0.05, "PIPE_FP32_ACTIVE": 0.25, "PIPE_FP16_ACTIVE": 0.1, "DRAM_ACTIVE": 0.3}
    for short, ratio in ratios.items():
        assert values(fams, f"DCGM_FI_PROF_{short}", gpu="1") == [pytest.approx(ratio)], short
        assert values(fams, f"DCGM_FI_PROF_{short}", gpu="2") == [0.0], short        # idle: 0, present
    assert values(fams, "DCGM_FI_PROF_PCIE_TX_BYTES", gpu="1") == [pytest.approx(1000 * MIB, rel=1e-6)]
    assert values(fams, "DCGM_FI_PROF_PCIE_RX_BYTES", gpu="1") == [pytest.approx(250 * MIB, rel=1e-6)]
    assert values(fams, "DCGM_FI_PROF_NVLINK_TX_BYTES", gpu="1") == [pytest.approx(4000 * MIB, rel=1e-6)]
    assert values(fams, "DCGM_FI_PROF_NVLINK_RX_BYTES", gpu="1") == [pytest.approx(2000 * MIB, rel=1e-6)]
    # DCGM's NVLink bandwidth: KiB of data RX + TX per second, divided by 1000
    assert values(fams, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="1") == [pytest.approx(6000 * 1024 / 1000, abs=3)]
    assert values(fams, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="2") == [0]
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in fams                      # bare metal
    assert values(fams, "hostagent_scrape_collector_success", collector="gpm") == [1]

    workload.set_load(store, "1", Load(gr=20, sm=10))                        # the next interval follows
    time.sleep(0.15)
    svc.sampler.sample_now()
    fams = parse(svc.render().decode())
    assert 0.1 <= values(fams, "DCGM_FI_PROF_SM_ACTIVE", gpu="1")[0] < 0.7


def test_no_gpm_before_hopper_no_profiling_series(service):
    store, svc = service("mixed", lambda st: workload.set_load(st, "0", Load(gr=50, sm=50, nvlink_tx=100)))
    fams = parse(svc.render().decode())
    assert not [name for name in fams if name.startswith("DCGM_FI_PROF_")]     # absent, never zeros
    assert values(fams, "hostagent_scrape_collector_success", collector="gpm") == [0]
    # NVLink bandwidth from the throughput counters: the A100s have NVLink, the T4 none
    assert {s.labels["gpu"] for s in fams["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].samples} == {"0", "1"}
    assert values(fams, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0") == [pytest.approx(102, abs=2)]


def test_mig_gpus_are_profiled_per_gpu_instance(service):
    def layout(store):
        with store.mutate() as s:
            s.set_mig_mode(store.facts, 0, MIG_ENABLE)
            s.reset_gpu(0)
            for pid in (9, 19, 19):                       # 3g.40gb and two 1g.10gb
                gi = s.create_gi(store.facts, 0, pid)
                s.create_ci(store.facts, 0, gi.id, store.facts.skus[s.gpus[0].sku].mig.by_id(pid).ci_profiles[-1].id)
        workload.set_load(store, "0:0", Load(gr=90, sm=60, dram=50, pcie_tx=300))
    store, svc = service("hgx-h100", layout)
    gis = store.read().gpus[0].gis
    fams = parse(svc.render().decode())
    for fam in INSTANCE_PROF_FAMILIES:
        assert sorted(s.labels.get("GPU_I_ID") for s in fam_samples(fams, fam.name, gpu="0")) == \
            sorted(str(gi.id) for gi in gis), fam.name            # per instance, not for the GPU
        assert len(fams[fam.name].samples) == 7 + 3, fam.name     # seven whole GPUs, three instances
    for fam in PROF_FAMILIES[len(INSTANCE_PROF_FAMILIES):]:       # PCIe, NVLink: the GPU's own
        assert not fam_samples(fams, fam.name, gpu="0"), fam.name
    big = str(gis[0].id)
    assert values(fams, "DCGM_FI_PROF_SM_ACTIVE", gpu="0", GPU_I_ID=big) == [pytest.approx(0.6)]
    assert values(fams, "DCGM_FI_PROF_DRAM_ACTIVE", gpu="0", GPU_I_ID=big) == [pytest.approx(0.5)]
    assert values(fams, "DCGM_FI_PROF_SM_ACTIVE", gpu="0", GPU_I_ID=str(gis[1].id)) == [0.0]
    assert values(fams, "hostagent_scrape_collector_success", collector="gpm") == [1]

    # an instance destroyed after the inventory was read: its series go, the others stay
    with store.mutate() as s:
        s.destroy_ci(0, gis[2].id, gis[2].cis[0].id)
        s.destroy_gi(0, gis[2].id)
    time.sleep(0.12)
    svc.sampler.sample_now()
    fams = parse(svc.render().decode())
    assert sorted(s.labels["GPU_I_ID"] for s in fam_samples(fams, "DCGM_FI_PROF_SM_ACTIVE", gpu="0")) == \
        sorted(str(gi.id) for gi in gis[:2])
    assert values(fams, "hostagent_scrape_collector_success", collector="gpm") == [0]


def fam_samples(fams, name, **match):
    return [s for s in fams.get(name, ()).samples if all(s.labels.get(k) == v for k, v in match.items())] \
        if name in fams else []


def test_a_failing_gpm_call_drops_that_gpus_series_only(service):
    store, svc = service("hgx-h100")
    lib = N.nvmlLib
    real = lib.nvmlGpmSampleGet
    broken = lib._handle("gpu", 3)                      # GPU 3's handle in the simulated library

    def failing(handle, sample):
        return N.NVML_ERROR_UNKNOWN if handle == broken else real(handle, sample)
    lib.nvmlGpmSampleGet = type(real)(failing)
    N._nvmlGetFunctionPointer_cache.pop("nvmlGpmSampleGet", None)
    try:
        time.sleep(0.12)
        svc.sampler.sample_now()
        fams = parse(svc.render().decode())
    finally:
        lib.nvmlGpmSampleGet = real
        N._nvmlGetFunctionPointer_cache.pop("nvmlGpmSampleGet", None)
    assert {s.labels["gpu"] for s in fams["DCGM_FI_PROF_SM_ACTIVE"].samples} == {"0", "1", "2", "4", "5", "6", "7"}
    assert values(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="3")                         # its other series stay
    assert values(fams, "hostagent_scrape_collector_success", collector="gpm") == [0]
    for _ in range(2):                                   # back: a first sample again, then its metrics
        time.sleep(0.12)
        svc.sampler.sample_now()
    fams = parse(svc.render().decode())
    assert len(fams["DCGM_FI_PROF_SM_ACTIVE"].samples) == 8
    assert values(fams, "hostagent_scrape_collector_success", collector="gpm") == [1]


def test_vgpu_licence_where_a_guest_driver_answers(service):
    def guests(store):
        with store.mutate() as s:
            s.gpus[0].vgpu_license, s.gpus[1].vgpu_license = "licensed", "unlicensed"
    store, svc = service("dgx-a100", guests)
    fams = parse(svc.render().decode())
    assert fams["DCGM_FI_DEV_VGPU_LICENSE_STATUS"].type == "gauge"
    assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_VGPU_LICENSE_STATUS"].samples} == {"0": 1, "1": 0}
