"""Device taints (KEP-5055, ``DRADeviceTaints``) from the agent's health, pure: the keys,
values and effects of NVIDIA's DRA driver (``cmd/gpu-kubelet-plugin/device_health.go``,
``healthEventToTaint``), on every published device whose health says so, and only while
it does.

| the device has | taint | effect |
|---|---|---|
| an XID that counts (the latest) | ``gpu.nvidia.com/xid=<XID>`` | ``NoSchedule`` |
| a double-bit ECC error | ``gpu.nvidia.com/xid=48`` (the driver's XID for it) | ``NoSchedule`` |
| only an XID the agent's policy ignores | ``gpu.nvidia.com/xid=<XID>`` | ``None`` |
| a lost GPU | ``gpu.nvidia.com/gpu-lost`` | ``NoSchedule`` |
| no health monitoring | ``gpu.nvidia.com/unmonitored`` | ``None`` |

Where NVIDIA's driver keeps a taint until it restarts (its issue #1455), a taint here goes
when the agent's health drops the problem (a quiet period passed, a clear, a GPU read
again), and a counted XID is not downgraded by an ignored one after it. XID 79 (the GPU
fell off the bus) and a lost GPU cannot recover without a reset: with ``no_execute`` they
are ``NoExecute``, which makes Kubernetes evict the pods using the device.

A Kubernetes 1.34 API server knows only ``NoSchedule`` and ``NoExecute`` (``None`` came in
1.35): informational taints are left out there.
"""

from __future__ import annotations

from dataclasses import replace

from .devices import Pool

__all__ = ["device_taints", "tainted", "for_server", "XID_KEY", "LOST_KEY", "UNMONITORED_KEY",
           "UNRECOVERABLE_XIDS", "ECC_DBE_XID", "NONE", "NO_SCHEDULE", "NO_EXECUTE"]

XID_KEY, LOST_KEY, UNMONITORED_KEY = "gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/unmonitored"
NONE, NO_SCHEDULE, NO_EXECUTE = "None", "NoSchedule", "NoExecute"
UNRECOVERABLE_XIDS = frozenset({79})     # "GPU has fallen off the bus" (NVIDIA's XID catalog)
ECC_DBE_XID = 48                         # "DBE (Double Bit Error) ECC Error"


def _taint(key: str, effect: str, value: str | None = None) -> dict:
    return {"key": key, **({"value": value} if value is not None else {}), "effect": effect}


def device_taints(health: dict | None, *, no_execute: bool = False) -> tuple[dict, ...]:
    """The taints of a device whose agent health is ``health`` (the ``Health`` of the API;
    None: the agent does not list it, so nothing is known and nothing tainted)."""
    if not health or health.get("state") in (None, "unknown"):
        return ()
    problems = health.get("problems") or []
    counted = [p for p in problems if not p.get("ignored")]
    out = []
    xids = [p for p in counted if p["kind"] in ("xid", "ecc_dbe")]
    if xids:
        latest = xids[-1]
        xid = latest["xid"] if latest["kind"] == "xid" else ECC_DBE_XID
        hard = no_execute and xid in UNRECOVERABLE_XIDS
        out.append(_taint(XID_KEY, NO_EXECUTE if hard else NO_SCHEDULE, str(xid)))
    elif any(p.get("ignored") for p in problems):
        out.append(_taint(XID_KEY, NONE, str(next(p for p in problems if p.get("ignored"))["xid"])))
    lost = any(p["kind"] == "gpu_lost" for p in counted)
    if lost:
        out.append(_taint(LOST_KEY, NO_EXECUTE if no_execute else NO_SCHEDULE))
    elif health.get("monitored") is False or health.get("state") == "unmonitored":
        out.append(_taint(UNMONITORED_KEY, NONE))
    return tuple(out)


def tainted(pool: Pool, views: dict[str, dict], *, no_execute: bool = False) -> Pool:
    """The pool with each device's taints from the health of the agent's device it stands
    for (``views``: uuid -> the agent's device view)."""
    devices = tuple(replace(d, taints=device_taints((views.get(d.health_of) or {}).get("health"),
                                                    no_execute=no_execute)) for d in pool.devices)
    return replace(pool, devices=devices)


def for_server(pool: Pool, version: tuple[int, int], taken: bool = True) -> Pool:
    """The pool as the API server takes it: without taints where it drops them (``taken``
    False: its DRADeviceTaints gate is off), without the ``None`` effect before 1.35."""
    if not any(d.taints for d in pool.devices):
        return pool
    keep = (lambda t: False) if not taken else (lambda t: t["effect"] != NONE) if version < (1, 35) \
        else (lambda t: True)
    return replace(pool, devices=tuple(replace(d, taints=tuple(t for t in d.taints if keep(t)))
                                       for d in pool.devices))
