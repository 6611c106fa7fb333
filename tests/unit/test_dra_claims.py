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
    ({**gpu_config(), "kind": ["GpuConfig"]}, 'p.kind: ["GpuConfig"] is not GpuConfig, MigDeviceConfig or VfioDeviceConfig'),
    ({**gpu_config(), "kind": {"GpuConfig": 1}}, "p.kind"),
    (gpu_config({"strategy": ["MPS"]}), 'p.sharing.strategy: ["MPS"] is not one of'),
    (gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": {"x": 1}}}),
     "p.sharing.timeSlicingConfig.interval"),
    (gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": "Long"}),
     'p.sharing.timeSlicingConfig: must be an object, not "Long"'),
    (gpu_config({"strategy": "MPS", "mpsConfig": ["x"]}), "p.sharing.mpsConfig: must be an object"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1e999999999"}}),
     "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '1e999999999' is too large"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "9Ei"}}),
     "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '9Ei' is too large"),
    # A JSON number, not a string: bounded the same (a 400-digit integer was taken whole).
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 10 ** 400}}),
     "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 1000000000"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": 2 ** 63}}}),
     "p.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: 9223372036854775808 is too large"),
    (gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": ["1Gi"]}}),
     "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: ['1Gi'] is not a quantity"),
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


def big(name):
    return Published(name, "gpu", "GPU-x", "GPU-x", {}, {"memory": {"value": "40Gi"}}, {"device": name})


@pytest.mark.parametrize("change, field", [
    (lambda c: c.update(status="allocated"), 'status: must be an object, not "allocated"'),
    (lambda c: c["status"].update(allocation=["x"]), "status.allocation: must be an object"),
    (lambda c: c["status"]["allocation"].update(devices=[]), "status.allocation.devices: must be an object"),
    (lambda c: c["status"]["allocation"]["devices"].update(results=5),
     "status.allocation.devices.results: must be an array, not 5"),
    (lambda c: c["status"]["allocation"]["devices"]["results"].append("gpu-1"),
     'status.allocation.devices.results[1]: must be an object, not "gpu-1"'),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(request=["a"]),
     'status.allocation.devices.results[0].request: must be a string, not ["a"]'),
    (lambda c: c["status"]["allocation"]["devices"].update(config={"x": 1}),
     "status.allocation.devices.config: must be an array"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append("GpuConfig"),
     'status.allocation.devices.config[0]: must be an object, not "GpuConfig"'),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append({"opaque": "GpuConfig"}),
     'status.allocation.devices.config[0] (FromClaim).opaque: must be an object'),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append(
        {"requests": 5, "opaque": {"driver": DRIVER, "parameters": gpu_config()}}),
     "status.allocation.devices.config[0] (FromClaim).requests: must be an array, not 5"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append(
        {"requests": [5], "opaque": {"driver": DRIVER, "parameters": gpu_config()}}),
     "status.allocation.devices.config[0] (FromClaim).requests[0]: must be a string, not 5"),
    (lambda c: c["status"]["allocation"]["devices"]["config"].append(
        {"opaque": {"driver": DRIVER, "parameters": "GpuConfig"}}),
     'status.allocation.devices.config[0] (FromClaim).opaque.parameters: must be an object, not "GpuConfig"'),
])
def test_a_claim_of_the_wrong_shape_is_an_error_naming_the_field(change, field):
    """Whatever JSON a claim holds: an error naming the field, never an exception that
    fails the kubelet's whole call."""
    c = claim([("a", "gpu-0")])
    change(c)
    with pytest.raises(ClaimError) as e:
        claim_results(c, DRIVER, POOL, DEVICES)
    assert str(e.value).startswith(field), str(e.value)


def test_a_pinned_limit_is_at_most_the_devices_memory():
    devices = {"gpu-0": big("gpu-0")}
    within = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "40Gi"}})
    assert claim_results(claim([("a", "gpu-0")], [("FromClaim", [], DRIVER, within)]), DRIVER, POOL, devices)
    for mps, field in (({"defaultPinnedDeviceMemoryLimit": "1e400"}, "'1e400' is too large"),
                       ({"defaultPinnedDeviceMemoryLimit": "41Gi"},
                        "defaultPinnedDeviceMemoryLimit: 41984Mi is more than the 40960Mi of device gpu-0"),
                       ({"defaultPerDevicePinnedMemoryLimit": {"0": "64Gi"}},
                        "defaultPerDevicePinnedMemoryLimit[0]: 65536Mi is more than the 40960Mi")):
        config = gpu_config({"strategy": "MPS", "mpsConfig": mps})
        with pytest.raises(ClaimError) as e:
            claim_results(claim([("a", "gpu-0")], [("FromClaim", [], DRIVER, config)]), DRIVER, POOL, devices)
        assert field in str(e.value), str(e.value)
