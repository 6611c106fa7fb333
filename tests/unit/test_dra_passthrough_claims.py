"""What NVIDIA's own tests and source expect of a claim's configs, checked on hostagent's
decoding: ``defaultPerDevicePinnedMemoryLimit`` keys that name no device fail the claim
(``MpsPerDevicePinnedMemoryLimit.Normalize``, its "invalid UUID" and "invalid index" cases),
and ``VfioDeviceConfig`` is decoded strictly, normalised and validated as NVIDIA's
``vfiodeviceconfig.go`` and ``iommu.go`` do; MIG devices carry their memorySlice
capacities (``MigDeviceInfo.GetDevice``)."""

import pytest

from hostagent.plugins.dra.claims import ClaimError, claim_results, parse_config
from hostagent.plugins.dra.devices import Published, build_pool

DRIVER, POOL = "gpu.nvidia.com", "node-1"
API = "resource.nvidia.com/v1beta1"
GPU0 = Published("gpu-0", "gpu", "UUID0", "UUID0", {}, {}, {"device": "UUID0"}, uuid="UUID0")
VFIO0 = Published("gpu-vfio-0", "vfio", "UUID0", "UUID0", {}, {}, {"passthrough": {"gpu": "0000:07:00.0"}})


def claim(device, params, request="gpu"):
    return {"status": {"allocation": {"devices": {
        "results": [{"request": request, "driver": DRIVER, "pool": POOL, "device": device}],
        "config": [{"source": "FromClaim", "requests": [request],
                    "opaque": {"driver": DRIVER, "parameters": params}}]}}}}


def mps(per_device, default="2Gi"):
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultPinnedDeviceMemoryLimit": default, "defaultPerDevicePinnedMemoryLimit": per_device}}}


@pytest.mark.parametrize("key", ["UUID1", "1"])         # NVIDIA's "invalid UUID", "invalid index"
def test_a_pinned_limit_key_naming_no_device_fails_the_claim(key):
    with pytest.raises(ClaimError) as e:
        claim_results(claim("gpu-0", mps({key: "1Gi"})), DRIVER, POOL, {"gpu-0": GPU0})
    assert f"defaultPerDevicePinnedMemoryLimit[{key}]: names no device" in str(e.value)


@pytest.mark.parametrize("key", ["UUID0", "0"])         # NVIDIA's "default is overridden" cases
def test_a_pinned_limit_key_naming_the_device_overrides_the_default(key):
    [r] = claim_results(claim("gpu-0", mps({key: "1Gi"})), DRIVER, POOL, {"gpu-0": GPU0})
    assert r.sharing["mpsConfig"]["defaultPerDevicePinnedMemoryLimit"] == {key: "1024Mi"}


@pytest.mark.parametrize("iommu, normal", [
    (None, {"backendPolicy": "LegacyOnly", "enableAPIDevice": False}),
    ({}, {"backendPolicy": "LegacyOnly", "enableAPIDevice": False}),
    ({"backendPolicy": ""}, {"backendPolicy": "LegacyOnly", "enableAPIDevice": False}),
    ({"backendPolicy": "PreferIommuFD"}, {"backendPolicy": "PreferIommuFD", "enableAPIDevice": False}),
    ({"backendPolicy": "LegacyOnly", "enableAPIDevice": True},
     {"backendPolicy": "LegacyOnly", "enableAPIDevice": True}),
])
def test_vfio_configs_normalise_as_nvidias(iommu, normal):
    params = {"apiVersion": API, "kind": "VfioDeviceConfig", **({} if iommu is None else {"iommu": iommu})}
    assert parse_config(params, "p") == ("VfioDeviceConfig", {"iommu": normal})


@pytest.mark.parametrize("params, says", [
    ({"iommu": {"backendPolicy": "Iommufd"}}, "p.iommu.backendPolicy: unknown IOMMU backend policy: Iommufd, "
                                               "supported IOMMU backend policies: LegacyOnly, PreferIommuFD"),
    ({"iommu": {"extra": 1}}, "p.iommu.extra: unknown field"),
    ({"sharing": {}}, "p.sharing: unknown field"),
    ({"iommu": {"enableAPIDevice": "yes"}}, "p.iommu.enableAPIDevice: \"yes\" is not true or false"),
    ({"iommu": 3}, "p.iommu: must be an object"),
])
def test_bad_vfio_configs_are_errors_naming_the_field(params, says):
    with pytest.raises(ClaimError) as e:
        parse_config({"apiVersion": API, "kind": "VfioDeviceConfig", **params}, "p")
    assert says in str(e.value)


def test_a_vfio_device_without_a_config_gets_the_default_and_a_gpu_config_cannot_apply_to_it():
    [r] = claim_results(claim("gpu-vfio-0", {"apiVersion": API, "kind": "VfioDeviceConfig"}), DRIVER, POOL,
                        {"gpu-vfio-0": VFIO0})
    assert r.sharing == {"iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": False}}
    with pytest.raises(ClaimError, match="a GpuConfig cannot apply to vfio device gpu-vfio-0"):
        claim_results(claim("gpu-vfio-0", {"apiVersion": API, "kind": "GpuConfig"}), DRIVER, POOL,
                      {"gpu-vfio-0": VFIO0})
    with pytest.raises(ClaimError, match="a VfioDeviceConfig cannot apply to gpu device gpu-0"):
        claim_results(claim("gpu-0", {"apiVersion": API, "kind": "VfioDeviceConfig"}), DRIVER, POOL, {"gpu-0": GPU0})


def test_mig_devices_made_outside_the_plugin_carry_a_memory_slice_capacity_each():
    gpu = {"kind": "gpu", "uuid": "GPU-a", "index": 0, "minor": 0, "product": "NVIDIA A100-SXM4-40GB",
           "mig": {"mode": {"current": "enabled", "pending": "enabled"}}, "mig_capable": True}
    mig = {"kind": "mig", "uuid": "MIG-a", "parent_uuid": "GPU-a", "profile": "3g.20gb", "gi_profile_id": 9,
           "placement": {"start": 4, "size": 4}, "ci_placement": {"start": 0, "size": 3}, "memory_mib": 19968,
           "multiprocessors": 42, "engines": {"copy": 3, "decoder": 2, "jpeg": 0, "ofa": 0, "encoder": 0}}
    [d] = build_pool({"GPU-a": gpu, "MIG-a": mig}, {}, {}).devices
    assert {k for k in d.capacity if k.startswith("memorySlice")} == {f"memorySlice{i}" for i in range(4, 8)}
    assert set(d.capacity) - {f"memorySlice{i}" for i in range(4, 8)} == {
        "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "memory"}
    assert len(d.attributes) + len(d.capacity) <= 32
