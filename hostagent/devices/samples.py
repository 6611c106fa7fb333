"""NVML metric reads into typed samples: one ``GpuSample`` per GPU, one ``InstanceSample`` per
GPU instance (its MIG devices share its memory, so NVML answers per instance).

``SampleReader`` keeps the device handles of one inventory and remembers which queries a
device refused with ``NOT_SUPPORTED`` (utilisation under MIG, memory temperature without
HBM, ...), so each interval asks NVML only what it can answer. Call ``read()`` inside an
NVML session (``devices.nvml_session``); build a new reader when the inventory changes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pynvml as N

from .records import Inventory

__all__ = ["Memory", "GpuSample", "InstanceSample", "NodeSample", "SampleReader"]

log = logging.getLogger(__name__)

_MIB = 1 << 20


@dataclass(frozen=True)
class Memory:
    total_mib: int
    used_mib: int
    free_mib: int
    reserved_mib: int


# hostagent.devices.samples.SampleReader.read() -> NodeSample.gpus
@dataclass(frozen=True)
class GpuSample:
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


# hostagent.devices.samples.SampleReader.read() -> NodeSample.instances
@dataclass(frozen=True)
class InstanceSample:
    gpu: int
    gi: int
    profile: str                           # the GPU instance's profile, "1g.5gb"
    devices: tuple[str, ...]               # UUIDs of its MIG devices
    memory: Memory | None = None


@dataclass(frozen=True)
class NodeSample:
    taken_at: float                        # time.time() at the start of the read
    duration_s: float
    gpus: tuple[GpuSample, ...]
    instances: tuple[InstanceSample, ...] = ()
    nvml_calls: int = 0                    # NVML queries this read made


class _Unsupported(Exception):
    pass


class SampleReader:
    """Reads samples for the devices of one inventory, handle lookups done once."""

    def __init__(self, inventory: Inventory):
        self.inventory = inventory
        self._handles: dict[int, object] = {}
        self._instance_handles: dict[tuple[int, int], object] = {}
        self._refused: set[tuple[str, str]] = set()      # (device, query) that said NOT_SUPPORTED
        self._calls = 0

    def read(self) -> NodeSample:
        start, t0 = time.time(), time.perf_counter()
        self._calls = 0
        gpus, instances = [], []
        for gpu in self.inventory.gpus:
            sample = self._read_gpu(gpu.index, gpu.uuid)
            gpus.append(sample)
            if gpu.mig_enabled and not sample.lost:
                instances += self._read_instances(gpu)
        return NodeSample(taken_at=start, duration_s=time.perf_counter() - t0, gpus=tuple(gpus),
                          instances=tuple(instances), nvml_calls=self._calls)

    # ---- one query, with memory of refusals ------------------------------------------

    def _ask(self, device: str, query: str, fn, *args):
        """fn(*args), or None if the device refused it (now or before); GPU_IS_LOST raises."""
        if (device, query) in self._refused:
            return None
        self._calls += 1
        try:
            return fn(*args)
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_GPU_IS_LOST:
                raise
            if e.value in (N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._refused.add((device, query))
            else:
                log.debug("%s on %s: %s", query, device, e)
            return None

    def _handle(self, index: int):
        if index not in self._handles:
            self._calls += 1
            self._handles[index] = N.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    # ---- GPUs ------------------------------------------------------------------------

    def _read_gpu(self, index: int, uuid: str) -> GpuSample:
        try:
            return GpuSample(index=index, uuid=uuid, **self._gpu_values(uuid, self._handle(index)))
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
        out["memory_temp_c"] = self._memory_temperature(uuid, h)
        power = ask(uuid, "power", N.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = None if power is None else power / 1000
        out["energy_mj"] = ask(uuid, "energy", N.nvmlDeviceGetTotalEnergyConsumption, h)
        out["sm_clock_mhz"] = ask(uuid, "sm_clock", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM)
        out["mem_clock_mhz"] = ask(uuid, "mem_clock", N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_MEM)
        out["pcie_replays"] = ask(uuid, "pcie_replay", N.nvmlDeviceGetPcieReplayCounter, h)
        rows = ask(uuid, "remapped_rows", N.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            out.update(remapped_correctable=corr, remapped_uncorrectable=unc,
                       remap_pending=bool(pending), remap_failure=bool(failure))
        return out

    def _memory(self, device: str, h) -> Memory | None:
        mem = self._ask(device, "memory", N.nvmlDeviceGetMemoryInfo, h, N.nvmlMemory_v2)
        if mem is None:
            return None
        return Memory(total_mib=mem.total // _MIB, used_mib=mem.used // _MIB,
                      free_mib=mem.free // _MIB, reserved_mib=mem.reserved // _MIB)

    def _memory_temperature(self, uuid: str, h) -> int | None:
        # A field value: the call succeeds and the entry carries its own return code.
        values = self._ask(uuid, "memory_temp", N.nvmlDeviceGetFieldValues, h, [N.NVML_FI_DEV_MEMORY_TEMP])
        if values is None:
            return None
        fv = values[0]
        if fv.nvmlReturn != N.NVML_SUCCESS:
            if fv.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED:
                self._refused.add((uuid, "memory_temp"))
            return None
        return _field_value(fv)

    # ---- GPU instances ---------------------------------------------------------------

    def _read_instances(self, gpu) -> list[InstanceSample]:
        out = []
        by_gi: dict[int, list] = {}
        for dev in gpu.mig.devices:
            by_gi.setdefault(dev.gi, []).append(dev)
        profiles = {gi.id: gi.profile for gi in gpu.mig.gpu_instances}
        for gi, devices in sorted(by_gi.items()):
            first = devices[0]
            try:
                handle = self._instance_handle(gpu.index, first.index)
                memory = self._memory(first.uuid, handle)
            except N.NVMLError as e:
                log.debug("GPU %d instance %d: %s", gpu.index, gi, e)
                memory = None
            out.append(InstanceSample(gpu=gpu.index, gi=gi, profile=profiles.get(gi, first.profile),
                                      devices=tuple(d.uuid for d in devices), memory=memory))
        return out

    def _instance_handle(self, gpu: int, mig_index: int):
        key = (gpu, mig_index)
        if key not in self._instance_handles:
            self._calls += 1
            self._instance_handles[key] = N.nvmlDeviceGetMigDeviceHandleByIndex(self._handle(gpu), mig_index)
        return self._instance_handles[key]


def _field_value(fv):
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
