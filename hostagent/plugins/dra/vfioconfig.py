"""NVIDIA's ``VfioDeviceConfig`` (``resource.nvidia.com/v1beta1``), decoded strictly,
normalised and validated as NVIDIA's driver does (``api/nvidia.com/resource/v1beta1/
vfiodeviceconfig.go``, ``iommu.go``), pure:

- ``iommu`` absent or null is ``{backendPolicy: LegacyOnly, enableAPIDevice: false}``;
  ``backendPolicy`` absent or empty is ``LegacyOnly``, ``enableAPIDevice`` absent is false;
- ``backendPolicy`` is ``LegacyOnly`` or ``PreferIommuFD``, anything else an error in
  NVIDIA's words ("unknown IOMMU backend policy: ...");
- an unknown field anywhere is an error naming it.
"""

from __future__ import annotations

import json

__all__ = ["KIND", "DEFAULT", "POLICIES", "parse_vfio", "passthrough_item"]

KIND = "VfioDeviceConfig"
POLICIES = ("LegacyOnly", "PreferIommuFD")
DEFAULT = {"iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": False}}


def parse_vfio(parameters: dict, where: str, error) -> dict:
    """The normalised config of a VfioDeviceConfig's ``parameters`` (apiVersion and kind
    checked by the caller); ``error(text)`` makes the exception to raise."""
    unknown = sorted(set(parameters) - {"apiVersion", "kind", "iommu"})
    if unknown:
        raise error(f"{where}.{unknown[0]}: unknown field (known: apiVersion, iommu, kind)")
    iommu = parameters.get("iommu")
    if iommu is None:
        return {"iommu": dict(DEFAULT["iommu"])}
    at = f"{where}.iommu"
    if not isinstance(iommu, dict):
        raise error(f"{at}: must be an object, not {json.dumps(iommu)[:40]}")
    unknown = sorted(set(iommu) - {"backendPolicy", "enableAPIDevice"})
    if unknown:
        raise error(f"{at}.{unknown[0]}: unknown field (known: backendPolicy, enableAPIDevice)")
    policy = iommu.get("backendPolicy") or "LegacyOnly"
    if policy not in POLICIES:
        raise error(f"{at}.backendPolicy: unknown IOMMU backend policy: {policy}, supported IOMMU backend "
                    f"policies: {', '.join(POLICIES)}")
    api = iommu.get("enableAPIDevice")
    if api is not None and not isinstance(api, bool):
        raise error(f"{at}.enableAPIDevice: {json.dumps(api)[:40]} is not true or false")
    return {"iommu": {"backendPolicy": policy, "enableAPIDevice": bool(api)}}


def passthrough_item(allocate: dict, config: dict) -> dict:
    """The agent's passthrough item for a vfio device under ``config``: iommufd's nodes when
    the policy prefers iommufd or the API device is asked for (the agent gives them where
    the node has iommufd; the legacy group and container nodes always)."""
    iommu = config.get("iommu") or DEFAULT["iommu"]
    iommufd = iommu.get("backendPolicy") == "PreferIommuFD" or bool(iommu.get("enableAPIDevice"))
    return {"passthrough": {**allocate["passthrough"], **({"iommufd": True} if iommufd else {})}}
