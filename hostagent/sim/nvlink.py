"""NVLink as the simulated driver counts it: the throughput counters ``nvmlDeviceGetFieldValues`` answers (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`` and
``_RX``: KiB since the driver loaded, per link or, with scope ``UINT_MAX``, over all links;
nvml.h). They grow with the GPU's simulated NVLink traffic (``sim load --nvlink-tx``), split
evenly over its links.

Like the energy counter, each process integrates the traffic from its first read (starting
from the traffic since the load was set), so a counter is monotonic within a process.
"""

from __future__ import annotations

import pynvml as N

from . import workload
from .links import links_of

__all__ = ["FIELDS"]

ALL_LINKS = 0xFFFFFFFF          # scopeId: the sum over every link
_KIB = 1024
_IDLE = (workload.IDLE, 0.0)


def _throughput(lib, state, gpu, fv, direction: int) -> None:
    links, scope = links_of(lib.facts, gpu), fv.scopeId
    if not links or not (scope == ALL_LINKS or scope < links):
        fv.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
        return
    counters = lib.modules.setdefault("nvlink_kib", {})       # gpu -> (t, (KiB tx, KiB rx), rates)
    now, last = fv.timestamp / 1e6, counters.get(gpu.index)     # one time per call, its timestamp
    if last is not None and last[0] == now:
        kib = last[1]                     # the call's other entry: counted already
    else:
        # Only a whole GPU's load moves data over NVLink (MIG devices have no peer-to-peer).
        load, since = workload.reader(lib).current(state).get(gpu.uuid, _IDLE) if state.loads else _IDLE
        rates = (load.nvlink_tx * _KIB, load.nvlink_rx * _KIB)
        if last is None:                  # the traffic since the load began (or the node booted)
            kib = workload.integrate((0.0, 0.0), rates, rates, max(since, lib._booted_at(state)), 0.0, now)
        else:
            kib = workload.integrate(last[1], last[2], rates, last[0], since, now)
        counters[gpu.index] = (now, kib, rates)
    fv.valueType, fv.nvmlReturn = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, N.NVML_SUCCESS
    fv.value.ullVal = int(kib[direction] if scope == ALL_LINKS else kib[direction] / links)


def _field(direction):
    def read(lib, state, gpu, mig, fv):
        if mig is not None:                     # a MIG device has no NVLink of its own
            fv.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
            return
        _throughput(lib, state, gpu, fv, direction)
    return read


FIELDS = {N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: _field(0),
          N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: _field(1)}
