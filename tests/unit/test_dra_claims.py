"""A claim's allocation as this driver's devices and their sharing: NVIDIA's opaque configs
(GpuConfig, MigDeviceConfig) decoded strictly, the class's then the claim's, the later
winning; every malformed or misplaced piece an error naming its field."""


import pytest

from hostagent.plugins.dra.claims import ClaimError, claim_results, parse_config
from hostagent.plugins.dra.devices import Published

DRIVER, POOL = "gpu.nvidia.com", "node-1"


def device(name, kind="gpu"):
    return Published(name, kind, "GPU-x", "GPU-x", {}, {}, {"device": name})


DEVICES = {d.name: d for d in (device("gpu-0"), device("gpu-1"), device("gpu-0-mig-1g5gb-19-0", "mig"),
                               device("gpu-1-mig-1g5gb-19-3", "partition"))}


def gpu_config(sharing=None, kind="GpuConfig"):
    out = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind}
    if sharing is not None:
        out["sharing"] = sharing
    return out


def claim(results, configs=()):
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "u"}, "status": {"allocation": {"devices": {
        "results": [{"request": r, "driver": DRIVER, "pool": POOL, "device": d} for r, d in results],
        "config": [{"source": source, "requests": requests, "opaque": {"driver": driver, "parameters": params}}
                   for source, requests, driver, params in configs]}}}}


def sharing_of(results):
    return [(r.request, r.device.name, r.sharing) for r in results]


def test_nvidias_demo_configs_decode_to_the_agents_sharing():
    assert parse_config(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}), "p") == (
        "GpuConfig", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    assert parse_config(gpu_config({"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}), "p") == (
        "GpuConfig", {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                                       "defaultPinnedDeviceMemoryLimit": "10240Mi"}})
    # Time-slicing without an interval is Default (NVIDIA's driver leaves {} unset and fails).
    assert parse_config(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {}}), "p")[1] == {
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
    assert parse_config(gpu_config(), "p") == ("GpuConfig", {"strategy": "Exclusive"})
    assert parse_config(gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {
        "0": "1Gi", "GPU-x": "2048Mi"}}}, "MigDeviceConfig"), "p")[1] == {
        "strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1024Mi", "GPU-x": "2048Mi"}}}


@pytest.mark.parametrize("params, field", [
    (gpu_config({"strategy": "Turbo"}), "p.sharing.strategy"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}),
     "p.sharing.mpsConfig.defaultActiveThreadPercentage: 150 is not between 0 and 100"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
     "p.sharing.mpsConfig.defaultActiveThreadPercentage"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Ki"}}),
     "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 100Ki is less than 1Mi"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
     "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"turbo": True}}), "p.sharing.mpsConfig.turbo: unknown field"),
    (gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
     "p.sharing.timeSlicingConfig.interval"),
    (gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}), "p.sharing.mpsConfig: only with strategy MPS"),
    (gpu_config({"strategy": "MPS", "timeSlicingConfig": {}}), "p.sharing.timeSlicingConfig: only with strategy"),
    (gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {}}, "MigDeviceConfig"),
     "p.sharing.timeSlicingConfig: unknown field"),
    ({**gpu_config(), "apiVersion": "resource.nvidia.com/v1"}, "p.apiVersion"),
    ({**gpu_config(), "kind": "ComputeDomainChannelConfig"}, "p.kind"),
    ({**gpu_config(), "extra": 1}, "p.extra: unknown field"),
    ("not an object", "p: must be an object"),
])
def test_bad_parameters_are_errors_naming_the_field(params, field):
    with pytest.raises(ClaimError) as e:
        parse_config(params, "p")
    assert str(e.value).startswith(field), str(e.value)


def test_the_claims_config_wins_over_the_class_and_the_later_over_the_earlier():
    ts = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})
    long = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    mps = gpu_config({"strategy": "MPS"})
    c = claim([("a", "gpu-0"), ("b", "gpu-1")], [
        ("FromClaim", ["a"], DRIVER, long), ("FromClass", ["a"], DRIVER, mps), ("FromClass", [], DRIVER, ts),
        ("FromClaim", [], "other.example.com", {"anything": "goes"})])
    assert sharing_of(claim_results(c, DRIVER, POOL, DEVICES)) == [
        ("a", "gpu-0", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
        ("b", "gpu-1", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})]
    # A config naming no request applies to the devices of its kind only; a subrequest
    # (firstAvailable) takes its request's config.
    c = claim([("gpus/big", "gpu-0"), ("migs", "gpu-0-mig-1g5gb-19-0"), ("parts", "gpu-1-mig-1g5gb-19-3")], [
        ("FromClaim", [], DRIVER, long), ("FromClaim", [], DRIVER, gpu_config({"strategy": "MPS"}, "MigDeviceConfig")),
        ("FromClaim", ["gpus"], DRIVER, mps)])
    assert [s["strategy"] for _, _, s in sharing_of(claim_results(c, DRIVER, POOL, DEVICES))] == [
        "MPS", "MPS", "MPS"]
    c = claim([("x", "gpu-0")])
    assert sharing_of(claim_results(c, DRIVER, POOL, DEVICES)) == [("x", "gpu-0", {"strategy": "Exclusive"})]


def test_results_of_other_drivers_are_theirs():
    c = claim([("a", "gpu-0")])
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "nic.example.com", "pool": "node-1", "device": "eth0"})
    assert [r.device.name for r in claim_results(c, DRIVER, POOL, DEVICES)] == ["gpu-0"]
    # A claim with none of this driver's devices is not this driver's to prepare.
    c["status"]["allocation"]["devices"]["results"].pop(0)
    for other, drivers in ((c, "nic.example.com"), (claim([]), "no driver")):
        with pytest.raises(ClaimError) as e:
            claim_results(other, DRIVER, POOL, DEVICES)
        assert str(e.value) == f"status.allocation.devices.results: no device of driver {DRIVER} (only of {drivers})"


@pytest.mark.parametrize("change, field", [
    (lambda c: c["status"].pop("allocation"), "status.allocation: the claim is not allocated"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="node-2"),
     "status.allocation.devices.results[0].pool: 'node-2' is not this node's pool"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="gpu-9"),
     "status.allocation.devices.results[0].device: 'gpu-9' is not published"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(adminAccess=True),
     "status.allocation.devices.results[0].adminAccess"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append({"source": "FromClaim", "requests": []}),
     "status.allocation.devices.config[0] (FromClaim): only opaque parameters are supported"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append(
        {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": DRIVER, "parameters": gpu_config(
            {"strategy": "MPS"}, "MigDeviceConfig")}}),
     "status.allocation.devices.config[0] (FromClaim): a MigDeviceConfig cannot apply to gpu device gpu-0"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append(
        {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": DRIVER, "parameters": gpu_config(
            {"strategy": "Turbo"})}}),
     "status.allocation.devices.config[0] (FromClaim).opaque.parameters.sharing.strategy"),
])
def test_what_does_not_fit_the_node_is_an_error_naming_the_field(change, field):
    c = claim([("a", "gpu-0")])
    change(c)
    with pytest.raises(ClaimError) as e:
        claim_results(c, DRIVER, POOL, DEVICES)
    assert str(e.value).startswith(field), str(e.value)
