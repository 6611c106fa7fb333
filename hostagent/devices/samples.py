"""NVML metric reads into typed samples: one ``GpuSample`` per GPU, one ``InstanceSample`` per
GPU instance (its MIG devices share its memory, so NVML answers per instance).

``SampleReader`` keeps the device handles of one inventory and remembers which queries a
device refused with ``NOT_SUPPORTED`` (utilisation under MIG, memory temperature without
HBM, ...), so each interval asks NVML only what it can answer. Call ``read()`` inside an
NVML session (``devices.nvml_session``); build a new reader when the inventory changes
(``previous=`` the old one: its GPUs' GPM samples carry over) and ``close()`` the old one.

Rates come from two reads: GPM's profiling metrics (``devices.gpm``) and the NVLink
throughput, whose counters are differenced between this read and the last, as DCGM does.
A rate's first read has nothing to pair with: ``NodeSample.pending`` says so, and the
sampler reads again soon.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import pynvml as N

from . import queries as Q
from .gpm import GPU_METRICS, INSTANCE_METRICS, GpmMetrics, GpmReader
from .records import Gpu, Inventory

__all__ = ["Memory", "GpuSample", "InstanceSample", "NodeSample", "SampleReader", "GpmMetrics"]

log = logging.getLogger(__name__)

_MIB = 1 << 20
ALL_LINKS = 0xFFFFFFFF     # a field's scopeId: the sum over every NVLink
# Read in one nvmlDeviceGetFieldValues call; each refused field is not asked again. The
# energy and PCIe replay counters are those nvmlDeviceGetTotalEnergyConsumption and
# nvmlDeviceGetPcieReplayCounter read (nvml.h), which are asked where the field is not.
_FIELDS = ((N.NVML_FI_DEV_MEMORY_TEMP, 0), (N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0),
           (N.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0), (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
           (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS))


# Records per device are named tuples: a pass builds one for every GPU instance, and a
# frozen dataclass costs a checked attribute write per field.
class Memory(NamedTuple):
    total_mib: int
    used_mib: int
    free_mib: int
    reserved_mib: int


# hostagent.devices.samples.SampleReader.read() -> NodeSample.gpus
class GpuSample(NamedTuple):
    """One physical GPU. None: the GPU cannot report that value (or the read failed)."""
    index: int
    uuid: str
    lost: bool = False
    gpu_util: int | None = None            # percent
    mem_copy_util: int | None = None       # percent of time memory was read or written
    enc_util: int | None = None
    dec_util: int | None = None
    memory: Memory | None = None
    gpu_temp_c: int | None = None
    memory_temp_c: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None           # since the driver loaded
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pcie_replays: int | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    gpm: GpmMetrics | None = None          # profiling metrics (Hopper and newer)
    nvlink_mbps: int | None = None         # NVLink data RX + TX over the last interval, as DCGM counts it
    vgpu_licensed: bool | None = None      # a vGPU guest's licence (None: not a vGPU guest)


# hostagent.devices.samples.SampleReader.read() -> NodeSample.instances
class InstanceSample(NamedTuple):
    gpu: int
    gi: int
    profile: str                           # the GPU instance's profile, "1g.5gb"
    devices: tuple[str, ...]               # UUIDs of its MIG devices
    memory: Memory | None = None
    gpm: GpmMetrics | None = None          # profiling metrics (Hopper and newer)


@dataclass(frozen=True)
class NodeSample:
    taken_at: float                        # time.time() at the start of the read
    duration_s: float
    gpus: tuple[GpuSample, ...]
    instances: tuple[InstanceSample, ...] = ()
    nvml_calls: int = 0                    # NVML queries this read made
    gpm_complete: bool = False             # every GPU (or its GPU instances) has its GPM metrics
    pending: bool = False                  # a rate had its first read: the next read gives it


class _Instance(NamedTuple):
    """What a read needs of a GPU instance, worked out once per inventory."""
    gi: int
    profile: str
    devices: tuple[str, ...]               # UUIDs of its MIG devices
    first: str                             # the MIG device its memory is asked through
    mig_index: int                         # that device's index on its GPU
    key: tuple                             # its GPM key: (GPU uuid, GPU instance id)


class _Plan(NamedTuple):
    """One GPU of the inventory: profiled whole, or per GPU instance where it has any (as
    dcgm-exporter's default, --devices f: GPU instances where MIG has them)."""
    index: int
    uuid: str
    instances: tuple[_Instance, ...]       # empty: the GPU is profiled whole

    @classmethod
    def of(cls, gpu: Gpu) -> "_Plan":
        if not (gpu.mig_enabled and gpu.mig.devices):
            return cls(gpu.index, gpu.uuid, ())
        by_gi: dict[int, list] = {}
        for dev in gpu.mig.devices:
            by_gi.setdefault(dev.gi, []).append(dev)
        profiles = {gi.id: gi.profile for gi in gpu.mig.gpu_instances}
        return cls(gpu.index, gpu.uuid, tuple(
            _Instance(gi, profiles.get(gi, devices[0].profile), tuple(d.uuid for d in devices),
                      devices[0].uuid, devices[0].index, (gpu.uuid, gi))
            for gi, devices in sorted(by_gi.items())))


class SampleReader:
    """Reads samples for the devices of one inventory, handle lookups done once."""

    def __init__(self, inventory: Inventory, previous: "SampleReader | None" = None):
        self.inventory = inventory
        self._handles: dict[int, object] = {}
        self._instance_handles: dict[tuple[int, int], object] = {}
        self._refused: set[tuple[str, str]] = set()      # (device, query) that said NOT_SUPPORTED
        self._calls = 0
        self._gpm = previous._gpm if previous is not None else GpmReader()
        # One read at a time (the sampler's thread, sample_now in another): a read reuses
        # its answer structures and the GPM buffers, which a new reader takes over.
        self._lock = previous._lock if previous is not None else threading.Lock()
        self._nvlink: dict[str, tuple[float, int]] = previous._nvlink if previous is not None else {}
        self._virtualization: dict[str, int] = {}        # GPU uuid -> nvmlDeviceGetVirtualizationMode
        self._pending = False
        self._gpm_keys: list[tuple] = []
        self._plans = tuple(_Plan.of(gpu) for gpu in inventory.gpus)
        self._memory_answer = Q.MemoryV2(version=N.nvmlMemory_v2)
        self._memory_ref = ctypes.byref(self._memory_answer)
        self._field_requests: dict[str, Q.FieldValues] = {}   # GPU uuid -> its fields not refused

    def read(self) -> NodeSample:
        with self._lock:
            return self._read()

    def _read(self) -> NodeSample:
        start, t0 = time.time(), time.perf_counter()
        self._calls = self._gpm.calls = 0
        self._pending, self._gpm_keys = False, []
        gpus, instances, profiled = [], [], []
        for plan in self._plans:
            sample = self._read_gpu(plan.index, plan.uuid, profile=not plan.instances)
            gpus.append(sample)
            if sample.lost:
                continue
            if plan.instances:
                found = self._read_instances(plan)
                instances += found
                profiled += found
            else:
                profiled.append(sample)
        self._gpm.keep_only(self._gpm_keys)
        if self._gpm.unsupported:
            log.info("no GPU performance monitoring (Hopper and newer have it) on GPU %s: no DCGM_FI_PROF_* "
                     "series for them", ", ".join(self._gpm.unsupported))
            self._gpm.unsupported.clear()
        complete = all(s.gpm is not None for s in profiled)
        return NodeSample(taken_at=start, duration_s=time.perf_counter() - t0, gpus=tuple(gpus),
                          instances=tuple(instances), nvml_calls=self._calls + self._gpm.calls,
                          gpm_complete=complete, pending=self._pending)

    def close(self) -> None:
        """Free what NVML holds for this reader (GPM sample buffers), in its session."""
        with self._lock:
            self._gpm.close()

    # ---- one query, with memory of refusals ------------------------------------------

    def _ask(self, device: str, query: str, fn, *args):
        """fn(*args), or None if the device refused it (now or before); GPU_IS_LOST raises."""
        if (device, query) in self._refused:
            return None
        self._calls += 1
        try:
            return fn(*args)
        except N.NVMLError as e:
            self._failed(device, query, e)
            return None

    def _ask_c(self, device: str, query: str, function: str, *args) -> bool:
        """The C function ``function(*args)``, which writes its answer into ``args``: whether
        it answered (False if the device refused it, now or before); GPU_IS_LOST raises."""
        if (device, query) in self._refused:
            return False
        self._calls += 1
        ret = Q.call(function, *args)
        if ret != N.NVML_SUCCESS:
            self._failed(device, query, N.NVMLError(ret))
        return ret == N.NVML_SUCCESS

    def _failed(self, device: str, query: str, error: N.NVMLError) -> None:
        if error.value == N.NVML_ERROR_GPU_IS_LOST:
            raise error
        if error.value in (N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_FUNCTION_NOT_FOUND):
            self._refused.add((device, query))
        else:
            log.debug("%s on %s: %s", query, device, error)

    def _handle(self, index: int):
        if index not in self._handles:
            self._calls += 1
            self._handles[index] = N.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    # ---- GPUs ------------------------------------------------------------------------

    def _read_gpu(self, index: int, uuid: str, profile: bool) -> GpuSample:
        try:
            h = self._handle(index)
            gpm = self._gpm_metrics((uuid,), uuid, h, "nvmlGpmSampleGet", (h,)) if profile else None
            return GpuSample(index=index, uuid=uuid, **self._gpu_values(uuid, h), gpm=gpm,
                             vgpu_licensed=self._vgpu_license(uuid, h))
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_GPU_IS_LOST:
                return GpuSample(index=index, uuid=uuid, lost=True)
            log.debug("GPU %d: %s", index, e)
            return GpuSample(index=index, uuid=uuid)

    def _gpu_values(self, uuid: str, h) -> dict:
        ask = self._ask
        out = {}
        util = ask(uuid, "utilization", N.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out["gpu_util"], out["mem_copy_util"] = util.gpu, util.memory
        enc = ask(uuid, "encoder", N.nvmlDeviceGetEncoderUtilization, h)
        dec = ask(uuid, "decoder", N.nvmlDeviceGetDecoderUtilization, h)
        out["enc_util"] = enc[0] if enc else None
        out["dec_util"] = dec[0] if dec else None
        out["memory"] = self._memory(uuid, h)
        out["gpu_temp_c"] = ask(uuid, "temperature", N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU)
        fields = self._fields(uuid, h)
        out["memory_temp_c"] = _field_value(fields.get(N.NVML_FI_DEV_MEMORY_TEMP))
        out["nvlink_mbps"] = self._nvlink_rate(uuid, fields)
        power = ask(uuid, "power", N.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = None if power is None else power / 1000
        energy = fields.get(N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
        out["energy_mj"] = (_field_value(energy) if energy is not None else
                            ask(uuid, "energy", N.nvmlDeviceGetTotalEnergyConsumption, h))
        out["sm_clock_mhz"] = ask(uuid, "sm_clock", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM)
        out["mem_clock_mhz"] = ask(uuid, "mem_clock", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_MEM)
        replays = fields.get(N.NVML_FI_DEV_PCIE_REPLAY_COUNTER)
        out["pcie_replays"] = (_field_value(replays) if replays is not None else
                               ask(uuid, "pcie_replay", N.nvmlDeviceGetPcieReplayCounter, h))
        rows = ask(uuid, "remapped_rows", N.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            out.update(remapped_correctable=corr, remapped_uncorrectable=unc,
                       remap_pending=bool(pending), remap_failure=bool(failure))
        return out

    def _memory(self, device: str, h) -> Memory | None:
        if not self._ask_c(device, "memory", "nvmlDeviceGetMemoryInfo_v2", h, self._memory_ref):
            return None
        mem = self._memory_answer
        return Memory(mem.total // _MIB, mem.used // _MIB, mem.free // _MIB, mem.reserved // _MIB)

    def _fields(self, uuid: str, h) -> dict:
        """The answered entries of one field-values call, by field id."""
        request = self._field_requests.get(uuid)
        if request is None:
            request = self._field_requests[uuid] = Q.FieldValues(
                f for f in _FIELDS if (uuid, f"field {f[0]}") not in self._refused)
        values = request.new() if request.fields else ()
        if values and not self._ask_c(uuid, "fields", "nvmlDeviceGetFieldValues", h, len(values),
                                      ctypes.byref(values)):
            values = ()
        got = {}
        for fv in values:
            if fv.nvmlReturn == N.NVML_SUCCESS:
                got[fv.fieldId] = fv
            elif fv.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED:
                self._refused.add((uuid, f"field {fv.fieldId}"))
                self._field_requests.pop(uuid, None)      # not asked again
        return got

    def _nvlink_rate(self, uuid: str, got: dict) -> int | None:
        """DCGM's NVLink bandwidth: (RX + TX KiB now - then) / seconds / 1000 (DcgmCacheManager
        ReadAndCacheNvLinkBandwidth), an integer."""
        rx, tx = got.get(N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX), got.get(N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)
        if rx is None or tx is None:
            self._nvlink.pop(uuid, None)
            return None
        total = rx.value.ullVal + tx.value.ullVal
        at = max(rx.timestamp, tx.timestamp) / 1e6 or time.time()
        last, self._nvlink[uuid] = self._nvlink.get(uuid), (at, total)
        if last is None or at <= last[0] or total < last[1]:
            self._pending = True
            return None
        return int((total - last[1]) / (at - last[0]) / 1000)

    def _gpm_metrics(self, key: tuple, uuid: str, h, take, args: tuple, metrics=GPU_METRICS):
        """GPM metrics of a GPU (or, with INSTANCE_METRICS, a GPU instance), or None."""
        if not self._gpm.supported(uuid, h):
            return None
        self._gpm_keys.append(key)
        found = self._gpm.read(key, take, args, metrics)
        if found is GpmReader.PENDING:
            self._pending = True
            return None
        return found

    def _vgpu_license(self, uuid: str, h) -> bool | None:
        """A vGPU guest's licence state, as DCGM reads it: licensing unsupported is unlicensed,
        else the vGPU feature's state; None on bare metal (the mode is asked once)."""
        mode = self._virtualization.get(uuid)
        if mode is None:
            mode = self._ask(uuid, "virtualization", N.nvmlDeviceGetVirtualizationMode, h)
            if mode is None and (uuid, "virtualization") not in self._refused:
                return None                  # no answer this time: asked again next time
            self._virtualization[uuid] = mode = N.NVML_GPU_VIRTUALIZATION_MODE_NONE if mode is None else mode
        if mode != N.NVML_GPU_VIRTUALIZATION_MODE_VGPU:
            return None
        features = self._ask(uuid, "licence", N.nvmlDeviceGetGridLicensableFeatures_v4, h)
        if features is None:
            return None
        if not features.isGridLicenseSupported:
            return False
        for feature in features.gridLicensableFeatures[:features.licensableFeaturesCount]:
            if feature.featureCode == N.NVML_GRID_LICENSE_FEATURE_CODE_VGPU:
                return feature.featureState > 0
        return None

    # ---- GPU instances ---------------------------------------------------------------

    def _read_instances(self, plan: _Plan) -> list[InstanceSample]:
        out = []
        parent = self._handle(plan.index)
        for inst in plan.instances:
            try:
                memory = self._memory(inst.first, self._instance_handle(plan.index, inst.mig_index))
            except N.NVMLError as e:
                log.debug("GPU %d instance %d: %s", plan.index, inst.gi, e)
                memory = None
            try:
                gpm = self._gpm_metrics(inst.key, plan.uuid, parent, "nvmlGpmMigSampleGet", (parent, inst.gi),
                                        INSTANCE_METRICS)
            except N.NVMLError as e:         # GPU_IS_LOST since its own values were read
                log.debug("GPU %d instance %d: %s", plan.index, inst.gi, e)
                gpm = None
            out.append(InstanceSample(plan.index, inst.gi, inst.profile, inst.devices, memory, gpm))
        return out

    def _instance_handle(self, gpu: int, mig_index: int):
        key = (gpu, mig_index)
        if key not in self._instance_handles:
            self._calls += 1
            self._instance_handles[key] = N.nvmlDeviceGetMigDeviceHandleByIndex(self._handle(gpu), mig_index)
        return self._instance_handles[key]


def _field_value(fv):
    if fv is None:
        return None
    kind = fv.valueType
    if kind == N.NVML_VALUE_TYPE_DOUBLE:
        return fv.value.dVal
    if kind == N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return fv.value.ullVal
    if kind == N.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return fv.value.sllVal
    if kind == N.NVML_VALUE_TYPE_SIGNED_INT:
        return fv.value.siVal
    return fv.value.uiVal
