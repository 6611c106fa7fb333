"""The sharing config file: the device plugin's format accepted unchanged, with its defaults
and its errors, plus hostagent's keys."""

import json
from pathlib import Path

import pytest
import yaml

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
    ({"version": "v2"}, "version: unknown version 'v2'"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": "some"}]}}},
     "sharing.timeSlicing.resources[0].devices: 'some' is not a device list"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": ["GPU-x"]}]}}},
     "sharing.timeSlicing.resources[0].devices[0]: 'GPU-x' is not a GPU index, a MIG name (0:1) or a UUID"),
    ({"sharing": {"mps": {"resources": [{"name": "GPU", "replicas": 2}]}}},
     "sharing.mps.resources[0].name: incorrect format for resource name 'nvidia.com/GPU'"),
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2, "pinnedMemoryLimit": "1000K"}]}}},
     "sharing.mps.resources[0].pinnedMemoryLimit: '1000K' is below 1 MiB"),
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


@pytest.mark.parametrize("doc, warning", [
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replica": 2, "replicas": 2}]}}},
     "sharing.mps.resources[0]: unknown key 'replica' (did you mean 'replicas'?), ignored"),
    ({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2, "interval": "Short"}]}}},
     "sharing.mps.resources[0]: unknown key 'interval', ignored"),       # an interval is time-slicing's
    ({"sharing": {"timeslicing": {"resources": [{"name": "gpu", "replicas": 2}]}}},
     "sharing: unknown key 'timeslicing' (did you mean 'timeSlicing'?), ignored"),
    ({"version": "v1", "newerPluginSection": {"a": 1}, "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}},
     "(top level): unknown key 'newerPluginSection', ignored"),
])
def test_unknown_keys_are_warnings_as_the_device_plugin_ignores_them(doc, warning):
    config = parse(doc, "share.yaml")
    assert config.warnings == (warning + " (as the device plugin ignores it)",)
    assert config.document == doc           # kept: the same file serves the plugin


def test_hostagents_own_configuration_still_refuses_unknown_keys(tmp_path):
    from hostagent.config import load_config
    path = tmp_path / "config.yaml"
    path.write_text("labels:\n  mig_stratgy: mixed\n")
    with pytest.raises(ConfigError, match=r"labels: unknown key 'mig_stratgy' \(did you mean 'mig_strategy'\?\)"):
        load_config(path)


def test_numbers_without_a_fraction_are_integers_as_the_device_plugin_reads_them():
    text = ("version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2.0\n"
            "      devices: 2.0\n      activeThreadPercentage: 5e1\n")
    (r,) = load_text(text, "share.yaml").strategies[0].resources
    assert (r.replicas, r.devices, r.active_thread_percentage) == (2, 2, 50)
    assert type(r.replicas) is int and type(r.devices) is int
    assert parse({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 4.0}]}}}
                 ).strategies[0].resources[0].replicas == 4      # an API body's JSON
    for bad, says in (("replicas: 2.5", "replicas: must be of type integer, not a number"),
                      ("replicas: .inf", "replicas: .inf is not a number a JSON document can hold"),
                      ("replicas: 2\n      devices: 1.5", "devices: 1.5 is not a device list")):
        with pytest.raises(ConfigError) as e:
            load_text(f"sharing:\n  mps:\n    resources:\n    - name: gpu\n      {bad}\n", "share.yaml")
        assert says in e.value.message and "\n" not in e.value.message


def test_json_looking_files_are_read_as_the_device_plugin_reads_them():
    trailing = '{"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2,}]}}}'
    assert load_text(trailing, "share.json").strategies[0].resources[0].replicas == 2
    go_indented = json.dumps({"version": "v1", "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 3}]}}},
                             indent="\t")
    assert load_text(go_indented, "share.json").strategies[0].resources[0].replicas == 3


DEVICE_PLUGIN_CASES = yaml.safe_load((Path(__file__).parent / "data" / "device_plugin_sharing_cases.yaml").read_text())


def _in_a_file(case) -> str:
    text = case["text"]
    return {"devices": '{"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2, "devices": %s}]}}}',
            "resource": '{"sharing": {"timeSlicing": {"resources": [%s]}}}',
            "resources": '{"sharing": {"timeSlicing": %s}}', "file": "%s"}[case["part"]] % text


@pytest.mark.parametrize("case", DEVICE_PLUGIN_CASES, ids=lambda c: f"{c['part']}: {c['text'][:40]}")
def test_device_plugin_config_cases(case):
    """The device plugin's own documents, in a file, get its verdict."""
    try:
        load_text(_in_a_file(case), "share.yaml")
        valid = True
    except ConfigError as e:
        assert "\n" not in e.message and e.message.startswith("share.yaml")
        valid = False
    assert valid == case["valid"]
