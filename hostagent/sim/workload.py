"""Simulated workloads: how busy the programs on a device keep it, as GPU performance
monitoring (GPM) and the NVLink and PCIe counters measure it, set with ``hostagent sim load``.

A load belongs to a GPU or a MIG device (by UUID) and lasts until it is changed or cleared,
or the driver goes (a reboot, an unload). It is part of the node's state (``loads``), so
every process sees the same workload; ``since`` (when it was set) lets a reader that sampled
before the change split its interval exactly.

``activity`` gives what a GPM sample of a GPU, a GPU instance or a MIG device sees. A MIG
device's percentages are of its own SMs (its DRAM share of its GPU instance's bandwidth); a
GPU instance or a MIG-enabled GPU sees its MIG devices weighted by their SMs (DRAM by the
instances' memory slices), and the sum of their PCIe traffic.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from operator import attrgetter

from ..errors import UsageError
from .links import links_of
from .node import MIG_ENABLE, NodeState
from .store import SimStore

__all__ = ["Load", "IDLE", "ZERO", "NAMES", "Loads", "reader", "set_load", "activity", "integrate",
           "pcie_limit_mib", "nvlink_limit_mib"]

_MIB = 1 << 20


@dataclass(frozen=True)
class Load:
    gr: float = 0.0          # % of time the graphics/compute engine is active
    sm: float = 0.0          # % of SMs with a warp resident (SM_UTIL)
    occupancy: float = 0.0   # % of the warps an SM can hold that are resident
    tensor: float = 0.0      # % of time a tensor pipe is busy (HMMA: half-precision matrix math)
    fp64: float = 0.0        # % of time the non-tensor FP64 / FP32 / FP16 pipes are busy
    fp32: float = 0.0
    fp16: float = 0.0
    dram: float = 0.0        # % of DRAM bandwidth (a MIG device: of its GPU instance's)
    pcie_tx: float = 0.0     # MiB/s out of the GPU over PCIe
    pcie_rx: float = 0.0     # MiB/s into it
    nvlink_tx: float = 0.0   # MiB/s over all NVLinks
    nvlink_rx: float = 0.0

    PERCENT = ("gr", "sm", "occupancy", "tensor", "fp64", "fp32", "fp16", "dram")
    # Pipes are busy only in cycles their SM has warps; an SM only while the engine is active.
    BELOW_SM = ("occupancy", "tensor", "fp64", "fp32", "fp16")

    def values(self) -> tuple[float, ...]:
        return _values(self)

    def problem(self) -> str | None:
        """Why this load cannot happen, or None."""
        for name in self.PERCENT:
            if not 0 <= getattr(self, name) <= 100:
                return f"--{name} {getattr(self, name):g} is not a percentage (0-100)"
        for name in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"):
            if getattr(self, name) < 0:
                return f"--{name.replace('_', '-')} {getattr(self, name):g} is negative"
        if self.sm > self.gr:
            return f"--sm {self.sm:g} is more than --gr {self.gr:g}: SMs are busy only while the engine is"
        for name in self.BELOW_SM:
            if getattr(self, name) > self.sm:
                return (f"--{name} {getattr(self, name):g} is more than --sm {self.sm:g}: a pipe or warp "
                        f"is active only on a busy SM")
        return None


IDLE = Load()
NAMES = tuple(f.name for f in fields(Load))
_values = attrgetter(*NAMES)


def pcie_limit_mib(sku) -> float:
    """What one direction of the board's PCIe link carries (128b/130b encoding from Gen3)."""
    gts = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}[sku.pcie_generation]
    encoding = 0.8 if sku.pcie_generation < 3 else 128 / 130
    return gts * 1e9 * sku.pcie_width * encoding / 8 / _MIB


def nvlink_limit_mib(links: int) -> float:
    """What ``links`` NVLinks carry in one direction: 25 GB/s each on NVLink 2 to 4 (V100's
    6 links 300 GB/s, A100's 12 links 600 GB/s, H100's 18 links 900 GB/s, both directions)."""
    return links * 25e9 / _MIB


# ---- the node's loads ------------------------------------------------------------------

class Loads:
    """The node's loads as one process reads them: parsed, and what each device sees worked
    out, once per state (the store hands out a new state only when its file changed)."""

    def __init__(self):
        self._state: NodeState | None = None
        self._loads: dict[str, tuple[Load, float]] = {}
        self._seen: dict[tuple, tuple[tuple, float]] = {}

    def _follow(self, state: NodeState) -> None:
        if state is not self._state:
            self._state, self._seen = state, {}
            self._loads = {u: (Load(**d["load"]), d["since"]) for u, d in state.loads.items()}

    def current(self, state: NodeState) -> dict[str, tuple[Load, float]]:
        """Device UUID -> (load, when it was set)."""
        self._follow(state)
        return self._loads

    def rates(self, facts, state: NodeState, key: tuple) -> tuple[tuple, float]:
        """(``activity``'s load as a tuple of rates, when it last changed) for ``key``, a
        device the caller found in ``state``."""
        self._follow(state)
        found = self._seen.get(key)
        if found is None:
            load, since = activity(facts, state, self._loads, key)
            found = self._seen[key] = (ZERO if load == IDLE else load.values(), since)
        return found


def reader(lib) -> Loads:
    """The simulated library's reader of its node's loads (one per process)."""
    found = lib.modules.get("loads")
    if found is None:
        found = lib.modules["loads"] = Loads()
    return found


def set_load(store: SimStore, device: str, load: Load | None) -> tuple[str, str]:
    """Give ``device`` (as ``sim hold`` names it) this load (None: clear it). Returns its
    UUID and a description ("GPU 0", "GPU 0 GI 3 CI 0")."""
    from .control import resolve_device
    with store.mutate() as state:
        gpu_index, gi, ci = resolve_device(state, device)
        gpu = state.live_gpu(gpu_index)
        where = f"GPU {gpu_index}" + (f" GI {gi} CI {ci}" if gi is not None else "")
        uuid = gpu.uuid if gi is None else state.find_ci(gpu_index, gi, ci)[2].uuid
        if load is None:
            state.loads.pop(uuid, None)
            return uuid, where
        why = _refusal(store.facts, state, gpu, gi, load, links_of(store.facts, gpu), where)
        if why:
            raise UsageError(f"load on {where}: {why}", hint="see hostagent sim load --help")
        state.loads[uuid] = {"load": asdict(load), "since": time.time()}
    return uuid, where


def _refusal(facts, state: NodeState, gpu, gi, load: Load, links: int, where: str) -> str | None:
    why = load.problem()
    if why:
        return why
    if gi is None and gpu.mig_current == MIG_ENABLE:
        return (f"GPU {gpu.index} has MIG enabled: its work runs on its MIG devices "
                f"(load one as {gpu.index}:N, 'hostagent devices' lists them)")
    if load.nvlink_tx or load.nvlink_rx:
        if gi is not None:
            return "a MIG device has no NVLink traffic: MIG gives no peer-to-peer access (MIG user guide)"
        if not links:
            return f"{facts.skus[gpu.sku].name} has no NVLink"
    sku = facts.skus[gpu.sku]
    pcie = (pcie_limit_mib(sku), f"PCIe Gen{sku.pcie_generation} x{sku.pcie_width}")
    nvlink = (nvlink_limit_mib(links), f"{links} NVLinks")
    for name, (limit, what) in (("pcie_tx", pcie), ("pcie_rx", pcie), ("nvlink_tx", nvlink), ("nvlink_rx", nvlink)):
        if getattr(load, name) > limit:
            return (f"--{name.replace('_', '-')} {getattr(load, name):g} MiB/s is more than the {what} of "
                    f"{where} carry ({limit:.0f} MiB/s)")
    return None


# ---- what a GPM sample sees ----------------------------------------------------------

def activity(facts, state: NodeState, current: dict, key: tuple) -> tuple[Load, float]:
    """(load, when it last changed) that a GPM sample of ``key`` sees: ("gpu", i),
    ("gi", i, gi id) or ("mig", i, gi id, ci id)."""
    gpu = state.gpus[key[1]]
    if key[0] == "mig":
        _, _, ci = state.find_ci(key[1], key[2], key[3])
        return current.get(ci.uuid, _IDLE)
    if key[0] == "gpu" and gpu.mig_current != MIG_ENABLE:
        return current.get(gpu.uuid, _IDLE)
    gis = gpu.gis if key[0] == "gpu" else [state.find_gi(key[1], key[2])[1]]
    loaded = [(gi, ci, current[ci.uuid]) for gi in gis for ci in gi.cis if ci.uuid in current] if current else ()
    if not loaded:
        return _IDLE
    mig = facts.skus[gpu.sku].mig
    sms = mig.by_id(gis[0].profile_id).multiprocessors if key[0] == "gi" else facts.skus[gpu.sku].multiprocessors
    sm_like, pcie, dram, since = [0.0] * 7, [0.0, 0.0], {}, 0.0
    for gi, ci, (load, when) in loaded:
        weight = mig.by_id(gi.profile_id).ci_profile(ci.profile_id).multiprocessors / sms
        for i, name in enumerate(_SM_LIKE):
            sm_like[i] += getattr(load, name) * weight
        pcie[0] += load.pcie_tx
        pcie[1] += load.pcie_rx
        dram[gi.id] = dram.get(gi.id, 0.0) + load.dram
        since = max(since, when)
    # A MIG device's DRAM share is of its GPU instance's bandwidth; an instance's of the GPU's,
    # by its memory slices.
    shares = {gi.id: 1.0 if key[0] == "gi" else gi.size / mig.memory_slices for gi in gis}
    total_dram = sum(min(100.0, pct) * shares[gi_id] for gi_id, pct in dram.items())
    return Load(*sm_like, dram=total_dram, pcie_tx=pcie[0], pcie_rx=pcie[1]), since


_SM_LIKE = ("gr", "sm", "occupancy", "tensor", "fp64", "fp32", "fp16")
_IDLE = (IDLE, 0.0)


def integrate(acc: tuple, before: tuple, after: tuple, t0: float, since: float, t1: float) -> tuple:
    """``acc`` plus the rates ``before`` and ``after`` integrated from ``t0`` to ``t1``:
    ``before`` until ``since`` (when the load changed), ``after`` from then on."""
    if since > t0:
        split = min(since, t1)
        return tuple(a + b * (split - t0) + c * (t1 - split) for a, b, c in zip(acc, before, after))
    return tuple(a + c * (t1 - t0) for a, c in zip(acc, after))


ZERO = (0.0,) * len(NAMES)
