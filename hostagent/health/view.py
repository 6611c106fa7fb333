"""Health in the inventory's views: annotate device listings, and one line per device."""

from __future__ import annotations

import time

from .records import DeviceHealth
from .state import HealthState

__all__ = ["annotate", "summary", "describe", "rows", "HEADERS"]

HEADERS = ["DEVICE", "UUID", "HEALTH", "REASONS", "LAST XID", "SINCE", "RECOVERS"]


def summary(dev: DeviceHealth | None) -> dict:
    """The ``health`` entry a device listing carries."""
    if dev is None:
        return {"state": "unknown"}
    out = {"state": dev.state, "since": dev.changed_at}
    if dev.reasons:
        out["reasons"] = [str(r) for r in dev.reasons]
    if dev.last_xid is not None:
        out["last_xid"] = dev.last_xid
    if dev.recover_at is not None:
        out["recover_at"] = dev.recover_at
    if not dev.monitored:
        out["unmonitored"] = dev.monitor_detail
    return out


def describe(dev: DeviceHealth) -> tuple[str, str]:
    """(reason, message) for an API record: the latest cause while unhealthy, why it is
    unmonitored, or "healthy"."""
    if not dev.healthy:
        message = ", ".join(dict.fromkeys(str(r) for r in dev.reasons))
        if any(r.sticky for r in dev.reasons):
            message += "; until cleared"
        elif dev.recover_at is not None:
            message += f"; healthy again {time.strftime('%H:%M:%S', time.localtime(dev.recover_at))} if quiet"
        return dev.reasons[-1].kind, message
    if not dev.monitored:
        return "unmonitored", dev.monitor_detail or "NVML events are not watched"
    last = f"; last XID {dev.last_xid}" if dev.last_xid is not None else ""
    return "healthy", "no XID, ECC or lost-GPU problem pending" + last


def annotate(listing: dict, state: HealthState) -> dict:
    """A copy of a device listing (``{"gpus": [...], "mig_devices": [...]}``, as ``hostagent
    devices -o json`` and the API give it) with a ``health`` entry on every GPU and MIG
    device."""
    out = dict(listing)
    for key in ("gpus", "mig_devices"):
        out[key] = [dict(d, health=summary(state.get(d.get("uuid")))) for d in listing.get(key, ())]
    return out


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "-"
    s = max(0, int(now - t))
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago" if s < 7200 else f"{s // 3600}h ago"


def _until(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    return f"in {max(0, int(t - now + 0.999))}s"


def rows(state: HealthState, now: float | None = None) -> list[list]:
    now = time.time() if now is None else now
    out = []
    for d in state.devices.values():
        reasons = ", ".join(dict.fromkeys(str(r) for r in d.reasons))
        if not d.monitored and not (d.lost and not d.healthy):     # "gpu lost" says it already
            reasons = ", ".join(filter(None, [reasons, f"unmonitored: {d.monitor_detail}"]))
        out.append([d.name, d.key, d.state, reasons or "-",
                    "-" if d.last_xid is None else d.last_xid, _ago(d.changed_at, now),
                    _until(d.recover_at, now)])
    return out
