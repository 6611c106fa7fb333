"""A ResourceClaim's allocation as this driver's devices and how each is shared, pure.

The results of this driver (others' are theirs to prepare) must name this node's pool and a
device published in it. Each result's configuration is the opaque ``resource.nvidia.com/v1beta1``
``GpuConfig`` (whole GPUs) or ``MigDeviceConfig`` (MIG devices and partitions) that applies
to it, found as NVIDIA's driver finds it: the allocation's configs in order, class configs
before claim configs, the later winning; a config applies to a result when it names the
result's request (or its parent request) or names none and is of the device's kind. A config
naming a request explicitly with the wrong kind, a config that is not opaque, and any
malformed or unknown parameter are errors naming the field, as is anything about the claim
that does not fit (not allocated, no device of this driver, another pool, a device not
published).

Parameters are decoded strictly (an unknown field is an error), as NVIDIA's driver decodes a
claim's: ``sharing.strategy`` is ``Exclusive``, ``TimeSlicing`` (``timeSlicingConfig.interval``
``Default``, ``Short``, ``Medium`` or ``Long``; GpuConfig only) or ``MPS`` (``mpsConfig``:
``defaultActiveThreadPercentage`` 0-100, ``defaultPinnedDeviceMemoryLimit``, and
``defaultPerDevicePinnedMemoryLimit`` by UUID or by index among the claim's devices of that
config, each at least 1Mi and at most the memory of the device it applies to).

Everything is the claim's, read as JSON of any shape: a field of the wrong type (a kind that
is a list, parameters that are a string, ``requests: 5``) is an error naming it, for that
claim alone, never an exception that fails the kubelet's whole call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .devices import Published
from .quantity import parse_quantity
from .vfioconfig import DEFAULT as VFIO_DEFAULT
from .vfioconfig import KIND as VFIO_KIND
from .vfioconfig import parse_vfio

__all__ = ["ClaimError", "Result", "claim_results", "parse_config", "API_VERSION"]

API_VERSION = "resource.nvidia.com/v1beta1"
KINDS = {"GpuConfig": ("gpu",), "MigDeviceConfig": ("mig", "partition"), VFIO_KIND: ("vfio",)}
STRATEGIES = ("Exclusive", "TimeSlicing", "MPS")
INTERVALS = ("Default", "Short", "Medium", "Long")


class ClaimError(Exception):
    """What is wrong with a claim, in one line naming the field."""


@dataclass(frozen=True)
class Result:
    request: str                  # the claim's request (``<request>/<subrequest>`` for firstAvailable)
    device: Published
    sharing: dict                 # the agent's ``sharing`` for it


def _shown(value) -> str:
    return json.dumps(value)[:40]


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise ClaimError(f"{where}: must be an object, not {_shown(value)}")
    return value


def _array(value, where: str) -> list:
    """A list field (absent: empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ClaimError(f"{where}: must be an array, not {_shown(value)}")
    return value


def _string(value, where: str) -> str:
    if not isinstance(value, str):
        raise ClaimError(f"{where}: must be a string, not {_shown(value)}")
    return value


def _fields(obj: dict, allowed: set[str], where: str) -> None:
    _object(obj, where)
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ClaimError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(allowed))})")


def _mib(value, where: str) -> str:
    try:
        size = parse_quantity(value)
    except ValueError as e:
        raise ClaimError(f"{where}: {e}") from None
    if size < 2 ** 20:
        raise ClaimError(f"{where}: {value} is less than 1Mi")
    return f"{size // 2 ** 20}Mi"


def _mps(config, where: str) -> dict:
    _fields(config, {"defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
                     "defaultPerDevicePinnedMemoryLimit"}, where)
    out = {}
    threads = config.get("defaultActiveThreadPercentage")
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise ClaimError(f"{where}.defaultActiveThreadPercentage: {json.dumps(threads)} is not an integer")
        if not 0 <= threads <= 100:
            raise ClaimError(f"{where}.defaultActiveThreadPercentage: {threads} is not between 0 and 100")
        out["defaultActiveThreadPercentage"] = threads
    if config.get("defaultPinnedDeviceMemoryLimit") is not None:
        out["defaultPinnedDeviceMemoryLimit"] = _mib(config["defaultPinnedDeviceMemoryLimit"],
                                                     f"{where}.defaultPinnedDeviceMemoryLimit")
    per_device = config.get("defaultPerDevicePinnedMemoryLimit")
    if per_device is not None:
        if not isinstance(per_device, dict):
            raise ClaimError(f"{where}.defaultPerDevicePinnedMemoryLimit: must map a device (UUID or index) to a "
                             "quantity")
        out["defaultPerDevicePinnedMemoryLimit"] = {
            str(k): _mib(v, f"{where}.defaultPerDevicePinnedMemoryLimit[{k}]") for k, v in per_device.items()}
    return out


def parse_config(parameters, where: str) -> tuple[str, dict]:
    """(kind, the agent's ``sharing``) of an opaque config's parameters (a VfioDeviceConfig's
    normalised config instead of a ``sharing``)."""
    if isinstance(parameters, dict) and parameters.get("kind") == VFIO_KIND:
        if parameters.get("apiVersion") != API_VERSION:
            raise ClaimError(f"{where}.apiVersion: {json.dumps(parameters.get('apiVersion'))} is not {API_VERSION}")
        return VFIO_KIND, parse_vfio(parameters, where, ClaimError)
    _fields(parameters, {"apiVersion", "kind", "sharing"}, where)
    if parameters.get("apiVersion") != API_VERSION:
        raise ClaimError(f"{where}.apiVersion: {json.dumps(parameters.get('apiVersion'))} is not {API_VERSION}")
    kind = parameters.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ClaimError(f"{where}.kind: {json.dumps(kind)} is not GpuConfig, MigDeviceConfig or {VFIO_KIND}")
    sharing = parameters.get("sharing")
    if sharing is None:
        return kind, {"strategy": "Exclusive"}
    at = f"{where}.sharing"
    _fields(sharing, {"strategy", "timeSlicingConfig", "mpsConfig"} - ({"timeSlicingConfig"}
                                                                      if kind == "MigDeviceConfig" else set()), at)
    strategy = sharing.get("strategy")
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ClaimError(f"{at}.strategy: {json.dumps(strategy)} is not one of {', '.join(STRATEGIES)}")
    out = {"strategy": strategy}
    if "timeSlicingConfig" in sharing:
        if strategy != "TimeSlicing":
            raise ClaimError(f"{at}.timeSlicingConfig: only with strategy TimeSlicing, not {strategy}")
        ts = sharing["timeSlicingConfig"] or {}
        _fields(ts, {"interval"}, f"{at}.timeSlicingConfig")
        interval = ts.get("interval", "Default")
        if not isinstance(interval, str) or interval not in INTERVALS:
            raise ClaimError(f"{at}.timeSlicingConfig.interval: {json.dumps(interval)} is not one of "
                             f"{', '.join(INTERVALS)}")
        out["timeSlicingConfig"] = {"interval": interval}
    elif strategy == "TimeSlicing" and kind == "GpuConfig":
        out["timeSlicingConfig"] = {"interval": "Default"}
    if "mpsConfig" in sharing:
        if strategy != "MPS":
            raise ClaimError(f"{at}.mpsConfig: only with strategy MPS, not {strategy}")
        out["mpsConfig"] = _mps(sharing["mpsConfig"] or {}, f"{at}.mpsConfig")
    return kind, out


def _configs(allocation: dict, driver: str) -> list[tuple[str, str, tuple[str, ...], dict]]:
    """(where, kind, requests, sharing) of the configs for this driver, lowest precedence first."""
    entries = list(enumerate(_array(_devices(allocation).get("config"), "status.allocation.devices.config")))
    for i, c in entries:
        _object(c, f"status.allocation.devices.config[{i}]")
    entries.sort(key=lambda e: 0 if e[1].get("source") == "FromClass" else 1)     # stable: order kept within
    out = []
    for i, c in entries:
        where = f"status.allocation.devices.config[{i}] ({c.get('source', 'FromClaim')})"
        opaque = c.get("opaque")
        if opaque is None:
            raise ClaimError(f"{where}: only opaque parameters are supported")
        if _object(opaque, f"{where}.opaque").get("driver") != driver:
            continue
        kind, sharing = parse_config(opaque.get("parameters"), f"{where}.opaque.parameters")
        requests = tuple(_string(r, f"{where}.requests[{n}]")
                         for n, r in enumerate(_array(c.get("requests"), f"{where}.requests")))
        out.append((where, kind, requests, sharing))
    return out


def _devices(allocation: dict) -> dict:
    devices = allocation.get("devices")
    return {} if devices is None else _object(devices, "status.allocation.devices")


def _within_memory(sharing: dict, device: Published, where: str) -> None:
    """A pinned memory limit is at most the device's memory (as the node's sharing
    configuration bounds it), where the device says its memory."""
    mps = sharing.get("mpsConfig") or {}
    memory = (device.capacity.get("memory") or {}).get("value")
    if not mps or memory is None:
        return
    total = parse_quantity(memory)
    limits = [("defaultPinnedDeviceMemoryLimit", mps.get("defaultPinnedDeviceMemoryLimit"))]
    limits += [(f"defaultPerDevicePinnedMemoryLimit[{k}]", v)
               for k, v in (mps.get("defaultPerDevicePinnedMemoryLimit") or {}).items()]
    for field, value in limits:
        if value is not None and parse_quantity(value) > total:
            raise ClaimError(f"{where}.sharing.mpsConfig.{field}: {value} is more than the {total // 2 ** 20}Mi of "
                             f"device {device.name}")


def _applies(requests: tuple[str, ...], request: str) -> bool:
    return request in requests or request.split("/", 1)[0] in requests


def claim_results(claim: dict, driver: str, pool: str, devices: dict[str, Published]) -> list[Result]:
    """This driver's results of an allocated claim, each with its device and sharing."""
    status = claim.get("status")
    allocation = _object(status, "status").get("allocation") if status is not None else None
    if not allocation:
        raise ClaimError("status.allocation: the claim is not allocated")
    _object(allocation, "status.allocation")
    every = _array(_devices(allocation).get("results"), "status.allocation.devices.results")
    for i, r in enumerate(every):
        _object(r, f"status.allocation.devices.results[{i}]")
    results = [(i, r) for i, r in enumerate(every) if r.get("driver") == driver]
    if not results:
        # The kubelet asks a driver only about claims with results of its own: this claim's
        # devices are another driver's (or it was allocated again meanwhile).
        drivers = sorted({str(r.get("driver") or "?") for r in every})
        raise ClaimError(f"status.allocation.devices.results: no device of driver {driver} (only of "
                         f"{', '.join(drivers) or 'no driver'})")
    configs = _configs(allocation, driver)
    out = []
    for i, r in results:
        where = f"status.allocation.devices.results[{i}]"
        _string(r.get("request"), f"{where}.request")
        if r.get("pool") != pool:
            raise ClaimError(f"{where}.pool: {r.get('pool')!r} is not this node's pool {pool!r}")
        device = devices.get(r.get("device")) if isinstance(r.get("device"), str) else None
        if device is None:
            raise ClaimError(f"{where}.device: {r.get('device')!r} is not published in pool {pool!r}")
        if r.get("adminAccess"):
            raise ClaimError(f"{where}.adminAccess: admin access to devices is not supported")
        sharing = dict(VFIO_DEFAULT) if device.kind == "vfio" else {"strategy": "Exclusive"}
        for cwhere, kind, requests, candidate in reversed(configs):
            if requests and not _applies(requests, r["request"]):
                continue
            if device.kind not in KINDS[kind]:
                if requests:
                    raise ClaimError(f"{cwhere}: a {kind} cannot apply to {device.kind} device {device.name} "
                                     f"(request {r['request']})")
                continue
            _within_memory(candidate, device, cwhere)
            sharing = candidate
            break
        out.append(Result(r["request"], device, sharing))
    _check_pinned_keys(out, configs)
    return out


def _check_pinned_keys(results: list[Result], configs: list) -> None:
    """Each ``defaultPerDevicePinnedMemoryLimit`` key names a device its config applies to:
    its UUID, or its index among them (NVIDIA's ``MpsPerDevicePinnedMemoryLimit.Normalize``
    fails a claim otherwise: "invalid UUID", "invalid index")."""
    for cwhere, _kind, _requests, candidate in configs:
        keys = ((candidate.get("mpsConfig") or {}).get("defaultPerDevicePinnedMemoryLimit") or {})
        if not keys:
            continue
        uuids = [r.device.uuid for r in results if r.sharing is candidate]
        for key in keys:
            if key in uuids or (key.isdigit() and int(key) < len(uuids)):
                continue
            which = (f"a UUID of one, or an index 0 to {len(uuids) - 1}" if uuids else
                     "no device of the claim is under this config")
            raise ClaimError(f"{cwhere}.opaque.parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]: "
                             f"names no device of the claim's {len(uuids)} under this config ({which})")
