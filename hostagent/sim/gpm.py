"""GPU performance monitoring (GPM) as nvml.h defines it: ``nvmlGpmQueryDeviceSupport``,
``nvmlGpmSampleAlloc``/``Free``, ``nvmlGpmSampleGet`` (a GPU or a MIG device),
``nvmlGpmMigSampleGet`` (a GPU instance) and ``nvmlGpmMetricsGet`` (metrics from two samples).

"For Hopper or newer fully supported devices" (every GPM function in nvml.h): older GPUs
report ``isSupportedDevice`` 0 and refuse samples with ``NOT_SUPPORTED``. A sample holds the
device's activity integrated up to the moment it was taken (``sim.workload``: what
``hostagent sim load`` set), so ``nvmlGpmMetricsGet`` gives the average over the interval
between two samples, as the real counters do. Sample buffers and the integration are this
process's, like the library's own.
"""

from __future__ import annotations

import ctypes
import struct
import time
from ctypes import c_uint, c_void_p

import pynvml as N

from . import workload
from .catalog import ARCHITECTURES
from .cfuncs import P, nvml, put as _put, struct as _struct
from .links import links_of
from .node import SimNvmlError

__all__ = ["supported", "METRICS"]

MIN_INTERVAL = 0.1        # nvml.h: samples should be more than 100 ms apart ("internal sample refresh rate")

_FIELD = {name: i for i, name in enumerate(workload.NAMES)}


def _avg(name):
    i = _FIELD[name]
    return lambda avg, links: avg[i]


def _zero(avg, links):
    return 0.0


def _link(direction: int, link: int):
    i = _FIELD["nvlink_tx" if direction else "nvlink_rx"]
    return lambda avg, links: avg[i] / links if link < links else None


# nvmlGpmMetricId_t -> value from the interval's average activity (None: NOT_SUPPORTED).
METRICS = {
    N.NVML_GPM_METRIC_GRAPHICS_UTIL: _avg("gr"),
    N.NVML_GPM_METRIC_SM_UTIL: _avg("sm"),
    N.NVML_GPM_METRIC_SM_OCCUPANCY: _avg("occupancy"),
    N.NVML_GPM_METRIC_INTEGER_UTIL: _zero,
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: _avg("tensor"),
    N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: _zero,
    N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: _avg("tensor"),      # a load's tensor work is HMMA
    N.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: _zero,
    N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: _zero,
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: _avg("dram"),
    N.NVML_GPM_METRIC_FP64_UTIL: _avg("fp64"),
    N.NVML_GPM_METRIC_FP32_UTIL: _avg("fp32"),
    N.NVML_GPM_METRIC_FP16_UTIL: _avg("fp16"),
    N.NVML_GPM_METRIC_PCIE_TX_PER_SEC: _avg("pcie_tx"),
    N.NVML_GPM_METRIC_PCIE_RX_PER_SEC: _avg("pcie_rx"),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: _avg("nvlink_rx"),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: _avg("nvlink_tx"),
}
# Per link: L0-L17 RX at 62 + 2n (TX one above), L18-L35 from 212.
for _n in range(N.NVML_NVLINK_MAX_LINKS):
    _base = 62 + 2 * _n if _n < 18 else 212 + 2 * (_n - 18)
    METRICS[_base] = _link(0, _n)
    METRICS[_base + 1] = _link(1, _n)
# Only the GPU sees its PCIe and NVLink traffic; GPU instances and MIG devices are asked for
# the engine, SM, pipe and DRAM metrics (DCGM serves the others at GPU level only).
GPU_ONLY = frozenset(m for m in METRICS if m >= N.NVML_GPM_METRIC_PCIE_TX_PER_SEC)
# Every id nvml.h defines; those not modelled (media engines, C2C, context switches, the
# cumulative counters) answer NOT_SUPPORTED, any other id INVALID_ARGUMENT.
DEFINED = frozenset(v for k, v in vars(N).items()
                    if k.startswith("NVML_GPM_METRIC_") and k != "NVML_GPM_METRIC_MAX")


def supported(lib, gpu) -> bool:
    return lib.facts.skus[gpu.sku].nvml_architecture >= ARCHITECTURES["hopper"]


class _Sample:
    """A filled sample buffer: whose, when, and the activity integrated until then."""
    __slots__ = ("key", "t", "acc", "links")

    def __init__(self, key, t, acc, links):
        self.key, self.t, self.acc, self.links = key, t, acc, links


class _Counters:
    """This process's GPM: sample buffers (address -> [ctypes buffer, _Sample or None]) and
    per device the activity integrated so far (key -> (t, integral, rates))."""

    def __init__(self):
        self.buffers: dict[int, list] = {}
        self.meters: dict[tuple, tuple] = {}
        self.skus: dict[str, tuple[bool, int]] = {}      # sku -> (GPM supported, NVLinks)

    def take(self, lib, key, state, gpu, sample) -> None:
        slot = self.buffers.get(sample or 0)
        if slot is None:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "not a GPM sample buffer")
        sku = self.skus.get(gpu.sku)
        if sku is None:
            sku = self.skus[gpu.sku] = (supported(lib, gpu), links_of(lib.facts, gpu))
        if not sku[0]:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "GPM needs Hopper or newer")
        now, last = time.time(), self.meters.get(key)
        rates, since = workload.reader(lib).rates(lib.facts, state, key) if state.loads else _IDLE
        if last is None:
            acc = workload.ZERO
        elif rates is workload.ZERO and last[2] is workload.ZERO:
            acc = last[1]                       # idle then and now: nothing to add
        else:
            acc = workload.integrate(last[1], last[2], rates, last[0], since, now)
        self.meters[key] = (now, acc, rates)
        slot[1] = _Sample(key, now, acc, sku[1])


_IDLE = (workload.ZERO, 0.0)


def _counters(lib) -> _Counters:
    found = lib.modules.get("gpm")
    if found is None:
        found = lib.modules["gpm"] = _Counters()
    return found


@nvml(P)
def nvmlGpmSampleAlloc(lib, out):
    if not out:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "NULL pointer")
    buf = ctypes.create_string_buffer(16)
    _counters(lib).buffers[ctypes.addressof(buf)] = [buf, None]
    _put(out, c_void_p, ctypes.addressof(buf))


@nvml(P)
def nvmlGpmSampleFree(lib, sample):
    if _counters(lib).buffers.pop(sample or 0, None) is None:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "not a GPM sample buffer")


@nvml(P, P)
def nvmlGpmQueryDeviceSupport(lib, handle, ptr):
    _, gpu, _ = lib._device(handle)
    info = _struct(ptr, N.c_nvmlGpmSupport_t)
    if info.version != N.NVML_GPM_SUPPORT_VERSION:
        raise SimNvmlError(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, f"struct version {info.version}")
    info.isSupportedDevice = int(supported(lib, gpu))


@nvml(P, P)
def nvmlGpmSampleGet(lib, handle, sample):
    # A GPU or a MIG device handle (nvml.h); a destroyed MIG device's is INVALID_ARGUMENT.
    state, gpu, mig = lib._device(handle)
    key = ("gpu", gpu.index) if mig is None else ("mig", gpu.index, mig[0].id, mig[1].id)
    _counters(lib).take(lib, key, state, gpu, sample)


@nvml(P, c_uint, P)
def nvmlGpmMigSampleGet(lib, handle, gi_id, sample):
    key = lib._key(handle)
    if key[0] != "gpu":
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "a GPU handle is needed, not a MIG device's")
    state = lib._state()
    gpu = state.live_gpu(key[1])
    if gpu.mig_current != N.NVML_DEVICE_MIG_ENABLE:
        raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "MIG mode is not enabled")
    if gpu.gi(gi_id) is None:
        raise SimNvmlError(N.NVML_ERROR_NOT_FOUND, f"no GPU instance {gi_id}")
    _counters(lib).take(lib, ("gi", gpu.index, gi_id), state, gpu, sample)


# nvmlGpmMetricsGet_t read and written in place: version, numMetrics, sample1, sample2, then
# nvmlGpmMetric_t entries (metricId, nvmlReturn, value, metricInfo); a ctypes access per
# field cost more than the rest of the call.
_HEAD = struct.Struct("@IIPP")
_HEAD_BYTES = ctypes.c_char * _HEAD.size
_FIRST = N.c_nvmlGpmMetricsGet_t.metrics.offset
_STRIDE = ctypes.sizeof(N.c_nvmlGpmMetric_t)
_ENTRY = "IId" + "x" * (_STRIDE - struct.calcsize("=IId"))
_ENTRIES: dict[int, tuple] = {}


def _entries(count: int) -> tuple:
    """(struct, ctypes array type) of ``count`` entries."""
    found = _ENTRIES.get(count)
    if found is None:
        layout = struct.Struct("=" + _ENTRY * count)
        found = _ENTRIES[count] = (layout, ctypes.c_char * layout.size)
    return found


_IDLE_ANSWERS: dict[tuple, list] = {}     # (metrics, whole GPU, links) -> answer over an idle span


_PLANS: dict[tuple, list] = {}


def _plan(metrics, whole_gpu: bool, links: int) -> list:
    """Per metric (id, its code when it has no value, or None and how to compute it)."""
    key = (metrics, whole_gpu, links)
    found = _PLANS.get(key)
    if found is None:
        found = _PLANS[key] = []
        for metric in metrics:
            compute = METRICS.get(metric)
            if compute is None or (metric in GPU_ONLY and not whole_gpu):
                found.append((metric, N.NVML_ERROR_NOT_SUPPORTED if metric in DEFINED else
                              N.NVML_ERROR_INVALID_ARGUMENT, None))
            elif compute(workload.ZERO, links) is None:            # a link the GPU does not have
                found.append((metric, N.NVML_ERROR_NOT_SUPPORTED, None))
            else:
                found.append((metric, None, compute))
    return found


def _answer(metrics, avg, whole_gpu: bool, links: int) -> list:
    """The entries (metricId, nvmlReturn, value, ...) for these metrics; ``avg`` None: the
    samples are within one counter refresh."""
    out = []
    for metric, code, compute in _plan(metrics, whole_gpu, links):
        if code is not None:
            out += (metric, code, 0.0)
        elif avg is None:
            out += (metric, N.NVML_ERROR_NO_DATA, 0.0)
        else:
            out += (metric, N.NVML_SUCCESS, compute(avg, links))
    return out


@nvml(P)
def nvmlGpmMetricsGet(lib, ptr):
    if not ptr:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "NULL pointer")
    version, count, one, two = _HEAD.unpack_from(_HEAD_BYTES.from_address(ptr))
    if version != N.NVML_GPM_METRICS_GET_VERSION:
        raise SimNvmlError(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, f"struct version {version}")
    if count > N.NVML_GPM_METRIC_MAX:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"{count} metrics")
    buffers = _counters(lib).buffers
    first, second = buffers.get(one or 0, _NONE)[1], buffers.get(two or 0, _NONE)[1]
    if first is None or second is None or first.key != second.key:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "two samples of one device are needed")
    layout, array = _entries(count)
    data = array.from_address(ptr + _FIRST)
    metrics = layout.unpack_from(data)[::3]
    span, whole_gpu = second.t - first.t, first.key[0] == "gpu"
    if span >= MIN_INTERVAL and first.acc is second.acc:      # nothing ran in between: every rate is 0
        key = (metrics, whole_gpu, first.links)
        out = _IDLE_ANSWERS.get(key)
        if out is None:
            out = _IDLE_ANSWERS[key] = _answer(metrics, workload.ZERO, whole_gpu, first.links)
    else:
        avg = tuple((b - a) / span for a, b in zip(first.acc, second.acc)) if span >= MIN_INTERVAL else None
        out = _answer(metrics, avg, whole_gpu, first.links)
    layout.pack_into(data, 0, *out)


_NONE = (None, None)
