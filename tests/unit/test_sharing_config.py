"""The sharing config file: the device plugin's format accepted unchanged, with its defaults
and its errors, plus hostagent's keys."""

import pytest

from hostagent.errors import ConfigError
from hostagent.sharing.config import load_text, parse

# The device plugin README's examples ("Shared Access to GPUs").
DP_TIME_SLICING = """
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
DP_MPS = """
version: v1
sharing:
  mps:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def test_device_plugin_files_are_accepted_with_its_defaults():
    ts = load_text(DP_TIME_SLICING, "ts.yaml")
    (s,) = ts.strategies
    assert (s.strategy, s.fail_requests_greater_than_one, s.rename_by_default) == ("time-slicing", False, False)
    (r,) = s.resources
    assert (r.name, r.devices, r.replicas, r.rename) == ("nvidia.com/gpu", "all", 10, None)
    mps = load_text(DP_MPS)
    (s,) = mps.strategies
    # MPS keeps the device plugin's historical default: requests for more than one replica fail.
    assert s.strategy == "mps" and s.fail_requests_greater_than_one is True
    assert s.resources[0].rename == "nvidia.com/gpu.shared"       # renameByDefault
    explicit = parse({"sharing": {"mps": {"failRequestsGreaterThanOne": False,
                                          "resources": [{"name": "gpu", "replicas": 2}]}}})
    assert explicit.strategies[0].fail_requests_greater_than_one is False
    assert explicit.strategies[0].resources[0].name == "nvidia.com/gpu"      # prefix added


def test_hostagent_keys_and_device_lists():
    c = parse({"version": "v1", "sharing": {
        "mps": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 1, "devices": ["0:1", 3],
                               "activeThreadPercentage": 30, "pinnedMemoryLimit": "2Gi"}]},
        "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2, "devices": 2,
                                       "interval": "Long"}]}}})
    mps, ts = c.strategies
    assert mps.resources[0].devices == ("0:1", "3") and mps.resources[0].pinned_memory_limit_mib == 2048
    assert mps.resources[0].active_thread_percentage == 30 and ts.resources[0].interval == "Long"
    assert ts.resources[0].devices == 2
    assert parse({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2,
                                                      "pinnedMemoryLimit": "3000M"}]}}}
                 ).strategies[0].resources[0].pinned_memory_limit_mib == 2861      # 3e9 bytes


@pytest.mark.parametrize("doc, says", [
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 0}]}}},
     "sharing.mps.resources[0].replicas: 0 is less than the minimum of 1"),
    ({"sharing": {"timeSlicing": {"resources": []}}}, "sharing.timeSlicing.resources: [] "),
    ({"sharing": {"mps": {}}}, "sharing.mps: missing the required key 'resources'"),
    ({"sharing": {"mps": {"resources": [{"name": "gpu"}]}}}, "missing the required key 'replicas'"),
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replica": 2, "replicas": 2}]}}},
     "sharing.mps.resources[0]: unknown key 'replica' (did you mean 'replicas'?)"),
    ({"version": "v2"}, "version: unknown version 'v2'"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": "some"}]}}},
     "sharing.timeSlicing.resources[0].devices: 'some' is not a device list"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": ["GPU-x"]}]}}},
     "sharing.timeSlicing.resources[0].devices[0]: 'GPU-x' is not a GPU index, a MIG name (0:1) or a UUID"),
    ({"sharing": {"mps": {"resources": [{"name": "GPU", "replicas": 2}]}}},
     "sharing.mps.resources[0].name: incorrect format for resource name 'nvidia.com/GPU'"),
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2, "interval": "Short"}]}}},
     "sharing.mps.resources[0]: unknown key 'interval'"),       # an interval is time-slicing's
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2, "pinnedMemoryLimit": "1000K"}]}}},
     "sharing.mps.resources[0].pinnedMemoryLimit: '1000K' is below 1 MiB"),
    ({"sharing": {"timeslicing": {"resources": [{"name": "gpu", "replicas": 2}]}}},
     "sharing: unknown key 'timeslicing' (did you mean 'timeSlicing'?)"),
    ([1, 2], "must be a mapping"),
])
def test_bad_files_are_one_error_naming_the_key(doc, says):
    with pytest.raises(ConfigError) as e:
        parse(doc, "share.yaml")
    assert says in e.value.message and e.value.message.startswith("share.yaml: ")
    assert "\n" not in e.value.message and "docs/sharing.md" in e.value.message


def test_malformed_yaml():
    with pytest.raises(ConfigError) as e:
        load_text("sharing: [unclosed", "bad.yaml")
    assert e.value.message.startswith("bad.yaml:1:19: not valid YAML or JSON") and "\n" not in e.value.message
