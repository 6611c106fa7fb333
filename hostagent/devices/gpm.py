"""Profiling metrics through NVML's GPU performance monitoring (GPM): Hopper and newer
GPUs, whole and per GPU instance.

GPM gives a metric only from two samples of a device's counters, as the average between
them (nvml.h; the samples at least 100 ms apart). Each device here keeps two sample
buffers and one request, allocated once: at every interval it samples into the older
buffer and asks ``nvmlGpmMetricsGet`` for the span since the previous sample, so one
sample per interval gives averages over the whole interval, as DCGM computes them
(``DcgmGpmManager``: the newest sample against the one an update interval older). The
first sample of a device has nothing to pair with: its metrics come with the next one.

Use inside an NVML session; ``close()`` frees the buffers (in the session that made them).
"""

from __future__ import annotations

import ctypes
import logging
import struct
import time
from typing import NamedTuple

import pynvml as N

from .queries import call

__all__ = ["GpmMetrics", "GpmReader", "GPU_METRICS", "INSTANCE_METRICS", "MIN_SPAN"]

log = logging.getLogger(__name__)

MIN_SPAN = 0.1           # seconds between two samples (nvml.h: the counters' refresh)


# hostagent.devices.samples: GpuSample.gpm, InstanceSample.gpm
class GpmMetrics(NamedTuple):
    """Averages over the span between two samples, in GPM's units: percentages, MiB/s.
    None: NVML gave no value for that metric (or a GPU instance has no such metric)."""
    graphics: float | None = None         # GRAPHICS_UTIL: time any engine was active
    sm: float | None = None               # SM_UTIL
    sm_occupancy: float | None = None
    tensor: float | None = None           # ANY_TENSOR_UTIL
    fp64: float | None = None
    fp32: float | None = None
    fp16: float | None = None
    dram: float | None = None             # DRAM_BW_UTIL
    pcie_tx: float | None = None          # MiB/s
    pcie_rx: float | None = None
    nvlink_tx: float | None = None        # MiB/s, every link
    nvlink_rx: float | None = None


# In the order of GpmMetrics' fields. A GPU instance has no PCIe or NVLink of its own (DCGM
# serves those at GPU level only), so it is asked for the first eight.
GPU_METRICS = (N.NVML_GPM_METRIC_GRAPHICS_UTIL, N.NVML_GPM_METRIC_SM_UTIL, N.NVML_GPM_METRIC_SM_OCCUPANCY,
               N.NVML_GPM_METRIC_ANY_TENSOR_UTIL, N.NVML_GPM_METRIC_FP64_UTIL, N.NVML_GPM_METRIC_FP32_UTIL,
               N.NVML_GPM_METRIC_FP16_UTIL, N.NVML_GPM_METRIC_DRAM_BW_UTIL,
               N.NVML_GPM_METRIC_PCIE_TX_PER_SEC, N.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
               N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC)
INSTANCE_METRICS = GPU_METRICS[:8]

# The request is read and written as bytes: its two sample pointers, then per metric
# (metricId, nvmlReturn, value) and the names NVML may point to, which are not needed.
# pynvml's structures check every attribute access, which cost more than the call.
_SAMPLES = struct.Struct("@PP")
_SAMPLES_AT = N.c_nvmlGpmMetricsGet_t.sample1.offset
_FIRST = N.c_nvmlGpmMetricsGet_t.metrics.offset
_STRIDE = ctypes.sizeof(N.c_nvmlGpmMetric_t)
_ENTRY = "IId" + "x" * (_STRIDE - struct.calcsize("=IId"))


class _Device:
    """One device's two sample buffers and its request, which names the metrics once."""

    def __init__(self, metrics: tuple[int, ...]):
        self.samples = (N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc())
        self.addresses = tuple(ctypes.cast(s, ctypes.c_void_p).value for s in self.samples)
        self.next = 0                     # the buffer the next sample goes into
        self.previous_at: float | None = None
        self.request = N.c_nvmlGpmMetricsGet_t()
        self.request.version = N.NVML_GPM_METRICS_GET_VERSION
        self.request.numMetrics = len(metrics)
        for i, metric in enumerate(metrics):
            self.request.metrics[i].metricId = metric
        self.ref = ctypes.byref(self.request)
        self.view = memoryview(self.request).cast("B")
        self.entries = struct.Struct("=" + _ENTRY * len(metrics))

    def free(self) -> None:
        for sample in self.samples:
            try:
                N.nvmlGpmSampleFree(sample)
            except N.NVMLError:
                pass


class GpmReader:
    """GpmMetricss of GPUs and GPU instances. ``read`` returns a ``GpmMetrics``, ``PENDING`` for a
    device's first sample, or None when GPM cannot serve it (NVML refused: the log says why)."""

    PENDING = "pending"

    def __init__(self):
        self._supported: dict[str, bool] = {}          # GPU uuid -> nvmlGpmQueryDeviceSupport
        self._devices: dict[tuple, _Device] = {}
        self._failing: set[tuple] = set()              # keys whose last GPM call failed (logged once)
        self.unsupported: list[str] = []               # GPUs found without GPM, until the caller logs them
        self.calls = 0

    def supported(self, uuid: str, handle) -> bool:
        """Whether the GPU has GPM (asked once; Ampere and older have none)."""
        found = self._supported.get(uuid)
        if found is None:
            self.calls += 1
            try:
                found = bool(N.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except N.NVMLError as e:
                if e.value == N.NVML_ERROR_GPU_IS_LOST:
                    raise
                found = False            # a driver without GPM: FUNCTION_NOT_FOUND, NOT_SUPPORTED
            if not found:
                self.unsupported.append(uuid)
            self._supported[uuid] = found
        return found

    def read(self, key: tuple, take: str, args: tuple, metrics: tuple[int, ...] = GPU_METRICS):
        """The metrics of device ``key`` since its previous sample; the C function ``take``
        (``nvmlGpmSampleGet`` or ``nvmlGpmMigSampleGet``) samples it, given ``args`` and
        the buffer. GPU_IS_LOST is raised."""
        device = self._devices.get(key)
        if device is None:
            self.calls += 2
            try:
                device = self._devices[key] = _Device(metrics)
            except N.NVMLError as e:
                self._failed(key, "sample buffers", e)
                return None
        self.calls += 1
        ret = call(take, *args, device.samples[device.next])
        if ret != N.NVML_SUCCESS:
            if ret == N.NVML_ERROR_GPU_IS_LOST:
                raise N.NVMLError(ret)
            self._failed(key, "sample", N.NVMLError(ret))
            device.previous_at = None             # start again from the next good sample
            return None
        now = time.monotonic()
        before, device.previous_at = device.previous_at, now
        device.next ^= 1
        if before is None or now - before < MIN_SPAN:
            return self.PENDING
        _SAMPLES.pack_into(device.view, _SAMPLES_AT, device.addresses[device.next], device.addresses[device.next ^ 1])
        self.calls += 1
        ret = call("nvmlGpmMetricsGet", device.ref)
        if ret != N.NVML_SUCCESS:
            self._failed(key, "metrics", N.NVMLError(ret))
            return None
        if key in self._failing:
            self._failing.discard(key)
            log.info("GPM of %s answers again", _name(key))
        entries = device.entries.unpack_from(device.view, _FIRST)
        codes, values = entries[1::3], entries[2::3]
        if any(codes):                            # NVML_SUCCESS is 0
            values = [value if code == N.NVML_SUCCESS else None for code, value in zip(codes, values)]
        return GpmMetrics(*values)

    def _failed(self, key, what: str, error) -> None:
        # A GPU instance destroyed since the inventory was read is no news: the next one drops it.
        gone = error.value in (N.NVML_ERROR_NOT_FOUND, N.NVML_ERROR_INVALID_ARGUMENT) and len(key) == 2
        level = logging.DEBUG if key in self._failing or gone else logging.WARNING
        self._failing.add(key)
        log.log(level, "GPM %s of %s failed (its DCGM_FI_PROF_* series are left out): %s", what, _name(key), error)

    def keep_only(self, keys) -> None:
        """Free the buffers of devices no longer read (a GPU instance destroyed)."""
        for key in set(self._devices) - set(keys):
            self._devices.pop(key).free()

    def close(self) -> None:
        self.keep_only(())


def _name(key: tuple) -> str:
    """(GPU uuid,) or (GPU uuid, GPU instance id)."""
    return key[0] if len(key) == 1 else f"{key[0]} GPU instance {key[1]}"
