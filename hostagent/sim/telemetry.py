"""What a simulated GPU's sensors read: plausible values as pure functions of the GPU, its
load and the time.

Each GPU gets a phase from its UUID, so GPUs differ but a given GPU reads the same at the
same moment in every process. Load is the share of the GPU that held processes keep busy;
an idle GPU sits at idle clocks and power, a held one rises towards its limits. Sensor
values wander slowly (periods of tens of seconds) so successive samples differ.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

from .catalog import SkuSpec

__all__ = ["Reading", "read_sensors", "load_of", "idle_power_mw", "has_hbm"]

IDLE_SM_CLOCK_MHZ = 210          # what data-centre boards idle at
GDDR_IDLE_MEM_CLOCK_MHZ = 405


@dataclass(frozen=True)
class Reading:
    gpu_util: int                # percent
    mem_util: int
    enc_util: int
    dec_util: int
    gpu_temp_c: int
    mem_temp_c: int
    power_mw: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    pcie_replays: int
    remapped_correctable: int


def _phase(uuid: str, salt: int) -> float:
    return (zlib.crc32(f"{uuid}/{salt}".encode()) % 10007) / 10007


def _wave(uuid: str, t: float, period: float, salt: int) -> float:
    """A slow, deterministic wander in [0, 1]."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period + _phase(uuid, salt)))


def has_hbm(sku: SkuSpec) -> bool:
    """Every simulated data-centre board has HBM except the T4 and the L40S (GDDR6, no
    memory sensor)."""
    return sku.architecture not in ("turing", "ada")


def load_of(uuid: str, processes: int, t: float) -> float:
    """Share of the GPU kept busy: 0 when idle, 0.6-1.0 while processes hold it."""
    if processes <= 0:
        return 0.0
    return min(1.0, (0.55 + 0.1 * processes) * (0.85 + 0.15 * _wave(uuid, t, 23.0, 1)))


def idle_power_mw(sku: SkuSpec) -> float:
    return sku.power_limit_w * 1000 * 0.16


def power_mw(sku: SkuSpec, uuid: str, load: float, t: float) -> int:
    limit = sku.power_limit_w * 1000
    return int(limit * (0.15 + 0.02 * _wave(uuid, t, 37.0, 2) + 0.78 * load))


def read_sensors(sku: SkuSpec, uuid: str, processes: int, t: float, booted_at: float) -> Reading:
    load = load_of(uuid, processes, t)
    util = round(100 * load)
    gpu_temp = 29 + 4 * _phase(uuid, 3) + 45 * load + 2 * _wave(uuid, t, 53.0, 4)
    busy = processes > 0
    hbm = has_hbm(sku)
    sm_clock = (sku.max_sm_clock_mhz * (0.93 + 0.07 * _wave(uuid, t, 17.0, 5))
                if busy else IDLE_SM_CLOCK_MHZ)
    mem_clock = sku.max_mem_clock_mhz if hbm or busy else GDDR_IDLE_MEM_CLOCK_MHZ
    # A replay every few hours of uptime, at a pace that differs per board.
    replay_period = 7200 * (1 + zlib.crc32(uuid.encode()) % 4)
    return Reading(
        gpu_util=util,
        mem_util=round(util * (0.4 + 0.2 * _wave(uuid, t, 29.0, 6))),
        enc_util=0,
        dec_util=round(8 * _wave(uuid, t, 41.0, 7)) if busy else 0,
        gpu_temp_c=round(gpu_temp),
        mem_temp_c=round(gpu_temp + 4 + 3 * _wave(uuid, t, 61.0, 8)),
        power_mw=power_mw(sku, uuid, load, t),
        sm_clock_mhz=round(sm_clock),
        mem_clock_mhz=mem_clock,
        pcie_replays=max(0, int((t - booted_at) // replay_period)),
        remapped_correctable=zlib.crc32(uuid.encode()) % 3)
