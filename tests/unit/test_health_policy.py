"""Which XIDs count: defaults and the device plugin's enable/disable semantics."""

import pytest

from hostagent.errors import ConfigError
from hostagent.health import DEFAULT_IGNORED_XIDS, HealthOptions, XidPolicy


def test_defaults_are_the_device_plugins():
    assert DEFAULT_IGNORED_XIDS == {13, 31, 43, 45, 68, 109}
    p = XidPolicy()
    assert all(p.ignored(x) for x in (13, 31, 43, 45, 68, 109))
    assert not any(p.ignored(x) for x in (48, 63, 64, 74, 79, 94, 95, 119))


@pytest.mark.parametrize("disable, enable, ignored, counted", [
    ("48", "", {48, 13}, {79}),                       # disable adds to the defaults
    ([48, "63"], [], {48, 63, 31}, {79}),             # lists from YAML, numbers or strings
    ("all", "", {13, 48, 79, 1000}, set()),           # everything ignored
    ("xids", "", {48, 79}, set()),                    # 'xids' means all, as in the plugin
    ("all", "48,79", {13, 63}, {48, 79}),             # enable picks XIDs out of 'all'
    ("", "13", {31}, {13}),                           # enable overrides the defaults
    ("13", "13", set(), {13}),                        # ... and the disable list
    ("48", "all", set(), {13, 31, 48, 109}),          # enable all: every XID counts
    (" 48 , ,63 ", None, {48, 63}, set()),            # spaces and empty parts tolerated
])
def test_enable_and_disable(disable, enable, ignored, counted):
    p = XidPolicy.from_lists(disable, enable)
    assert all(p.ignored(x) for x in ignored), [x for x in ignored if not p.ignored(x)]
    assert not any(p.ignored(x) for x in counted), [x for x in counted if p.ignored(x)]


def test_device_plugin_variables_fill_what_the_config_file_leaves_empty():
    env = {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}
    p = HealthOptions.from_config({"disable_xids": [], "enable_xids": []}, env).policy
    assert p.ignored(48) and not p.ignored(79) and p.describe() == "XIDs ignored except 79"
    # the file wins where it says something: here it keeps 79 ignored, 'all' still from env
    p = HealthOptions.from_config({"disable_xids": [], "enable_xids": [48]}, env).policy
    assert p.ignored(79) and not p.ignored(48)
    assert HealthOptions.from_config(None, {}) == HealthOptions()
    assert HealthOptions.from_config(None, {"DP_DISABLE_HEALTHCHECKS": " "}) == HealthOptions()
    # the file's disable list replaces the variable's 'all': 48 joins the defaults, 63 counts
    p = HealthOptions.from_config({"disable_xids": [48]}, env).policy
    assert p.ignored(13) and p.ignored(48) and not p.ignored(63)
    with pytest.raises(ConfigError) as e:
        HealthOptions.from_config(None, {"DP_ENABLE_HEALTHCHECKS": "48;63"})
    assert e.value.message.startswith("DP_ENABLE_HEALTHCHECKS: '48;63' is neither an XID")


@pytest.mark.parametrize("bad", ["abc", "-3", "0", "48;63", ["x"]])
def test_bad_entries_are_config_errors(bad):
    with pytest.raises(ConfigError) as e:
        XidPolicy.from_lists(bad)
    assert "health.disable_xids" in e.value.message


def test_describe():
    assert XidPolicy().describe() == "ignored XIDs: 13, 31, 43, 45, 68, 109"
    assert XidPolicy.from_lists("all", "48").describe() == "XIDs ignored except 48"
    assert XidPolicy.from_lists("", "all").describe() == "every XID counts"


def test_options_from_config_section():
    o = HealthOptions.from_config({"enabled": True, "quiet_period": 0, "disable_xids": [48],
                                   "enable_xids": ["all"], "wait_timeout_ms": 500})
    assert o.quiet_period is None and o.disable_xids == (48,) and o.wait_timeout_ms == 500
    assert not o.policy.ignored(13)
    assert HealthOptions.from_config(None) == HealthOptions()
    assert HealthOptions.from_config({"quiet_period": None}).quiet_period is None


def test_health_and_metrics_sections_of_the_config_file(tmp_path):
    from hostagent.config import load_config
    from hostagent.metrics import MetricsOptions
    path = tmp_path / "config.yaml"
    path.write_text("health:\n  quiet_period: 60\n  disable_xids: [48]\n  enable_xids: [all]\n"
                    "metrics:\n  port: null\n  interval: 30\n")
    config = load_config(path)
    health = HealthOptions.from_config(config.section("health"))
    assert (health.quiet_period, health.disable_xids, health.wait_timeout_ms) == (60, (48,), 1000)
    assert not health.policy.ignored(13)
    metrics = MetricsOptions.from_config(config.section("metrics"))
    assert (metrics.port, metrics.interval, metrics.address) == (None, 30, "127.0.0.1")
    defaults = load_config(tmp_path / "absent.yaml")
    assert HealthOptions.from_config(defaults.section("health")) == HealthOptions()
    assert MetricsOptions.from_config(defaults.section("metrics")) == MetricsOptions()
    path.write_text("health:\n  disable_xids: [nope]\n")
    with pytest.raises(ConfigError, match="health.disable_xids"):
        load_config(path)
