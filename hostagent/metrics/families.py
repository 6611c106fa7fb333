"""The metric families hostagent exports under DCGM exporter's names, and where each value
comes from. Names, types and help texts follow dcgm-exporter's default counters so its
dashboards and alerts work unchanged; every value is one NVML gives without DCGM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Family", "GPU_FAMILIES", "INSTANCE_FAMILIES", "PROF_FAMILIES", "INSTANCE_PROF_FAMILIES",
           "XID_FAMILY", "HEALTH_FAMILIES", "ALL_NAMES"]

_MIB = 1 << 20


@dataclass(frozen=True)
class Family:
    name: str
    type: str                     # gauge | counter (exposed under the DCGM name, no _total)
    help: str
    value: Callable               # sample -> number or None (None: no series)
    digits: int = 3               # decimals of a float value


def _mem(attr):
    return lambda s: None if s.memory is None else getattr(s.memory, attr)


def _flag(attr):
    return lambda s: None if getattr(s, attr) is None else int(getattr(s, attr))


def _attr(attr):
    return lambda s: getattr(s, attr)


def _ratio(attr):
    """A GPM percentage as DCGM's ratio (its profiling fields divide by 100)."""
    def value(s):
        pct = None if s.gpm is None else getattr(s.gpm, attr)
        return None if pct is None else pct / 100
    return value


def _bytes(attr):
    """A GPM rate in MiB/s as DCGM's integer bytes per second."""
    def value(s):
        rate = None if s.gpm is None else getattr(s.gpm, attr)
        return None if rate is None else int(rate * _MIB)
    return value


# Per physical GPU (devices.samples.GpuSample).
GPU_FAMILIES = (
    Family("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _attr("sm_clock_mhz")),
    Family("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", _attr("mem_clock_mhz")),
    Family("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", _attr("memory_temp_c")),
    Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _attr("gpu_temp_c")),
    Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _attr("power_w")),
    Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
           "Total energy consumption since boot (in mJ).", _attr("energy_mj")),
    Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", _attr("pcie_replays")),
    Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", _attr("gpu_util")),
    Family("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", _attr("mem_copy_util")),
    Family("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", _attr("enc_util")),
    Family("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", _attr("dec_util")),
    Family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _mem("free_mib")),
    Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _mem("used_mib")),
    Family("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", _mem("reserved_mib")),
    Family("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB).", _mem("total_mib")),
    Family("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
           "Number of remapped rows for uncorrectable errors", _attr("remapped_uncorrectable")),
    Family("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
           "Number of remapped rows for correctable errors", _attr("remapped_correctable")),
    Family("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
           _flag("remap_failure")),
    Family("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending",
           _flag("remap_pending")),
)

# NVML has no per-GPU series of these on GPUs without NVLink or a vGPU guest driver.
GPU_FAMILIES += (
    # As DCGM computes it: NVLink data RX + TX over the last interval, (KiB now - then) / s /
    # 1000, an integer, though dcgm-exporter declares it a counter.
    Family("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
           "Total number of NVLink bandwidth counters for all lanes.", _attr("nvlink_mbps")),
    Family("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", _flag("vgpu_licensed")),
)

# GPU performance monitoring (Hopper and newer), per GPU; the first eight per GPU instance
# too (DCGM serves PCIe and NVLink traffic at GPU level only). Help texts are
# dcgm-exporter's (etc/default-counters.csv) where it has one.
PROF_FAMILIES = (
    Family("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
           _ratio("graphics"), 6),
    Family("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
           _ratio("sm"), 6),
    Family("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
           _ratio("sm_occupancy"), 6),
    Family("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
           _ratio("tensor"), 6),
    Family("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.", _ratio("fp64"), 6),
    Family("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.", _ratio("fp32"), 6),
    Family("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.", _ratio("fp16"), 6),
    Family("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
           "Ratio of cycles the device memory interface is active sending or receiving data.", _ratio("dram"), 6),
    Family("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including "
           "both protocol headers and data payloads - in bytes per second.", _bytes("pcie_tx")),
    Family("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including "
           "both protocol headers and data payloads - in bytes per second.", _bytes("pcie_rx")),
    Family("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "The rate of data transmitted over NVLink - including "
           "both protocol headers and data payloads - in bytes per second.", _bytes("nvlink_tx")),
    Family("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink - including "
           "both protocol headers and data payloads - in bytes per second.", _bytes("nvlink_rx")),
)
INSTANCE_PROF_FAMILIES = PROF_FAMILIES[:8]

# Per GPU instance (devices.samples.InstanceSample): NVML answers memory for MIG devices.
_INSTANCE = {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_TOTAL"}
INSTANCE_FAMILIES = tuple(f for f in GPU_FAMILIES if f.name in _INSTANCE)

# From the health monitor, for GPUs and GPU instances: 0 until an XID arrives.
XID_FAMILY = Family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", None)

# hostagent's own, per GPU and MIG device, from the health state.
HEALTH_FAMILIES = (
    Family("hostagent_device_healthy", "gauge",
           "1 if the device is healthy (no XID, ECC or lost-GPU problem pending), else 0.", None),
    Family("hostagent_device_monitored", "gauge",
           "1 if NVML events of the device are watched, 0 if monitoring could not start.", None),
)

ALL_NAMES = tuple(f.name for f in GPU_FAMILIES + PROF_FAMILIES) + (XID_FAMILY.name,)
