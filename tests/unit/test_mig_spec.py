"""mig-parted v1 config files: accepted unchanged, rejected with mig-parted's errors."""

import json
from pathlib import Path

import pytest
import yaml

from hostagent.errors import ConfigError, NotFoundError
from hostagent.mig.spec import ConfigEntry, ConfigNotSelected, DeviceFilter, parse_spec

# The shapes mig-parted's example and default configs use (examples/config.yaml,
# dgx-station-80gb-config.yaml, config-default.yaml): "all", index lists, string and list
# filters with and without the subsystem qualifier, CI forms, +me names, empty mig-devices.
MIG_PARTED_STYLE = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  all-1g.5gb.me:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb+me": 1

  all-balanced:
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 2
        "2g.12gb": 1

  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices:
        "1c.3g.20gb": 3
        "3g.20gb": 0
    - devices: [5,6,7]
      mig-enabled: true
      mig-devices:
        "3c.3g.20gb": 2

  station:
    - device-filter: ["0x20B210DE:0x147F10DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    - device-filter: "0x1FB010DE"
      devices: all
      mig-enabled: false
"""


def test_mig_parted_style_file_is_accepted_unchanged():
    spec = parse_spec(MIG_PARTED_STYLE, "config.yaml")
    assert list(spec.configs) == ["all-disabled", "all-enabled", "all-1g.5gb.me", "all-balanced",
                                  "custom-config", "station"]
    assert spec.configs["all-enabled"] == (ConfigEntry("all", True, ()),)
    balanced = spec.configs["all-balanced"]
    assert [len(e.device_filter) for e in balanced] == [4, 1]
    assert balanced[1].mig_devices == (("1g.6gb", 2), ("2g.12gb", 1))
    custom = spec.configs["custom-config"]
    assert custom[0].devices == (0, 1, 2, 3) and custom[1].mig_devices == (("1c.3g.20gb", 3), ("3g.20gb", 0))
    station = spec.configs["station"][0].device_filter[0]
    assert (station.device, station.subsystem) == (0x20B210DE, 0x147F10DE)


def test_round_trip_through_the_written_form():
    spec = parse_spec(MIG_PARTED_STYLE)
    again = parse_spec(json.dumps(spec.to_dict()))
    assert again.configs == spec.configs


def test_device_selection_with_filters_and_indices():
    spec = parse_spec(MIG_PARTED_STYLE)
    a100, a30 = 0x20B010DE, 0x20B710DE
    first, second = spec.configs["all-balanced"]
    assert first.selects(3, a100) and not first.selects(3, a30) and second.selects(0, a30)
    custom = spec.configs["custom-config"]
    assert custom[1].selects(4, a100) and not custom[1].selects(5, a100)
    station = spec.configs["station"][0]
    assert station.selects(0, 0x20B210DE, 0x147F10DE)
    assert not station.selects(0, 0x20B210DE, 0x151F10DE)       # all four ids must match
    assert DeviceFilter.parse("0x20B010DE").matches(a100, 0x12345678)   # unqualified: any subsystem


def _one(entry: str) -> str:
    return f"version: v1\nmig-configs:\n  c:\n    - {entry}\n"


@pytest.mark.parametrize("text, message", [
    ("mig-configs: {}\n", "unable to parse with missing 'version' field"),
    ("version: v2\nmig-configs: {c: [{devices: all, mig-enabled: false}]}\n", "unknown version: v2"),
    ("version: v1\nmig-configs: {c: [{devices: all, mig-enabled: false}]}\nextra: 1\n", "unexpected field: extra"),
    ("version: v1\nmig-configs: {}\n", "at least one entry in 'mig-configs' is required"),
    ("version: v1\nmig-configs: {c: []}\n", "at least one entry in 'c' is required"),
    (_one("{mig-enabled: false}"), "missing required field: devices"),
    (_one("{devices: all}"), "missing required field: mig-enabled"),
    (_one("{devices: some, mig-enabled: false}"), "invalid string input for 'devices': some"),
    (_one("{devices: 7, mig-enabled: false}"),                                      # issue #44
     "'devices' must be \"all\" or a list of GPU indices such as [0, 1], not 7 (mig-parted: json: cannot "
     "unmarshal number into Go value of type string, json: cannot unmarshal number into Go value of type []int)"),
    (_one("{devices: [0, x], mig-enabled: false}"),
     "not [0, \"x\"] (mig-parted: json: cannot unmarshal array into Go value of type string, json: cannot "
     "unmarshal string into Go value of type int)"),
    (_one("{devices: all, mig-enabled: true, mig-devices: {1g.5gb: '2'}}"),
     "the count of '1g.5gb' is \"2\", a string: write the number without quotes (mig-parted: json: cannot "
     "unmarshal string into Go value of type int)"),
    (_one("{devices: all, mig-enabled: true, mig-devices: {1g.5gb: 1.5}}"),
     "json: cannot unmarshal number 1.5 into Go value of type int"),
    (_one("{devices: all, mig-enabled: true}"),
     "missing required field 'mig-devices' when 'mig-enabled' is true"),
    (_one("{devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}"),
     "MIG devices included when 'mig-enabled' is false"),
    (_one("{devices: all, mig-enabled: true, mig-devices: {1g.5gb: 0, 2g.10gb: 0}}"),
     "all counts for all MigProfiles are 0"),
    (_one("{devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}"), "invalid count for '1g.5gb': -1"),
    (_one("{devices: all, mig-enabled: true, mig-devices: {1x.5gb: 1}}"),
     "error validating values in 'mig-devices' field: invalid format for '1x.5gb'"),
    (_one("{devices: all, mig-enabled: true, mig-devices: {}, colour: red}"), "unexpected field: colour"),
    (_one("{devices: all, mig-enabled: yes-please}"), "invalid input for 'mig-enabled'"),
    (_one("{device-filter: 0x20B010DE, devices: all, mig-enabled: false}"), "quote hex ids"),
    (_one("{device-filter: '0xZZ', devices: all, mig-enabled: false}"), "invalid device-filter '0xZZ'"),
    ("version: v1\nmig-configs: [\n", "not valid YAML or JSON"),
])
def test_malformed_files_are_rejected_with_mig_parted_messages(text, message):
    with pytest.raises(ConfigError) as e:
        parse_spec(text, "bad.yaml")
    assert message in e.value.message and "bad.yaml" in e.value.message


def test_entry_errors_say_where_they_are():
    with pytest.raises(ConfigError, match=r"mig-configs\.c\[0\]: missing required field: devices"):
        parse_spec(_one("{mig-enabled: false}"))


def test_selecting_a_config():
    spec = parse_spec(MIG_PARTED_STYLE, "config.yaml")
    assert spec.select("station")[0] == "station"
    with pytest.raises(NotFoundError, match="no MIG config named 'nope'.*all-balanced"):
        spec.select("nope")
    with pytest.raises(ConfigNotSelected, match="missing required flag 'selected-config' .*6 configs"):
        spec.select(None)
    only = parse_spec(_one("{devices: all, mig-enabled: false}"))
    assert only.select(None)[0] == "c"     # the only config may be left implicit


def test_config_names_stay_strings_even_where_yaml_1_1_sees_booleans():
    spec = parse_spec("version: v1\nmig-configs:\n  off:\n    - {devices: all, mig-enabled: no}\n"
                      "  base:\n    - &b {devices: all, mig-enabled: yes, mig-devices: {1g.5gb: 1}}\n"
                      "  on:\n    - <<: *b\n      devices: [0]\n")
    assert list(spec.configs) == ["off", "base", "on"]
    assert spec.configs["off"][0].mig_enabled is False          # values keep YAML 1.1 booleans
    assert spec.configs["on"][0] == ConfigEntry((0,), True, (("1g.5gb", 1),))


MIG_PARTED_CASES = yaml.safe_load((Path(__file__).parent / "data" / "mig_parted_spec_cases.yaml").read_text())


@pytest.mark.parametrize("case", MIG_PARTED_CASES, ids=lambda c: f"{c['part']}: {c['name']}")
def test_mig_parted_spec_cases(case):
    """mig-parted's own documents, tab-indented Go raw strings with trailing commas: read as
    it reads them, except where a deliberate difference says why."""
    text = case["text"]
    if case["part"] == "entry":
        text = '{"version": "v1", "mig-configs": {"c": [' + (text or "null") + "]}}"
    try:
        parse_spec(text, "spec.yaml")
        valid = True
    except ConfigError as e:
        assert "\n" not in e.message and e.message.startswith("spec.yaml")
        valid = False
    assert valid == (case["valid"] and "differs" not in case), case["name"]


def test_a_file_without_configs_parses_and_selecting_from_it_fails():
    for text in ("", "version: v1\n"):
        spec = parse_spec(text, "empty.yaml")
        assert spec.configs == {}
        for name in (None, "all-disabled"):
            with pytest.raises(NotFoundError, match="empty.yaml: the file has no MIG configs"):
                spec.select(name)
