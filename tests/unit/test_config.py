"""hostagent config: defaults from the schema, errors with key paths, the shim's cache."""

import json
import os

import pytest

from hostagent.config import load_config, load_config_cached, schema
from hostagent.errors import ConfigError


def test_missing_file_means_documented_defaults(tmp_path):
    config = load_config(tmp_path / "none.yaml")
    assert config.source is None
    rt = config.runtime
    assert rt.low_level_runtimes == ("runc", "crun")
    assert rt.cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi")
    assert rt.accept_env_unprivileged is False          # the secure default
    assert rt.default_kind == "nvidia.com/gpu"
    assert config.hook.interpreter is None


def test_every_key_has_a_default_and_a_description():
    for section in schema()["properties"].values():
        assert section["description"]
        for key, prop in section["properties"].items():
            assert "default" in prop and prop.get("description"), key


def test_partial_file_keeps_other_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  accept_env_unprivileged: true\n")
    rt = load_config(path).runtime
    assert rt.accept_env_unprivileged is True and rt.low_level_runtimes == ("runc", "crun")


def test_empty_file_is_all_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# nothing yet\n")
    assert load_config(path).runtime.annotation_prefixes == ("cdi.k8s.io/",)


@pytest.mark.parametrize("text, where", [
    ("runtime:\n  cdi_spec_dirs: [/etc/cdi, relative]\n", "runtime.cdi_spec_dirs[1]: 'relative' must be an absolute path"),
    ("runtime:\n  low_level_runtimes: runc\n", "runtime.low_level_runtimes: must be of type array, not a string"),
    ("runtime:\n  typo: 1\n", "runtime: unknown key 'typo'"),
    ("runtime:\n  low_level_runtime: [runc]\n", "runtime: unknown key 'low_level_runtime' (did you mean 'low_level_runtimes'?)"),
    ("nosuchsection: {}\n", "(top level): unknown key 'nosuchsection'"),
    ("runtim: {}\n", "(top level): unknown key 'runtim' (did you mean 'runtime'?)"),
    ("runtime:\n  default_kind: gpu\n", "runtime.default_kind:"),
    ("hook:\n  interpreter: python3\n", "hook.interpreter: 'python3' must be an absolute path"),
])
def test_errors_name_the_key_path(tmp_path, text, where):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert where in e.value.message and str(path) in e.value.message


def test_malformed_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("runtime: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_cache_is_used_while_the_file_is_unchanged(tmp_path):
    path, cache = tmp_path / "c.yaml", tmp_path / "cache"
    path.write_text("runtime:\n  accept_env_unprivileged: true\n")
    assert load_config_cached(path, cache).runtime.accept_env_unprivileged is True
    [cached] = cache.iterdir()
    data = json.loads(cached.read_text())
    data["data"]["runtime"]["default_kind"] = "example.com/marker"    # prove the cache is read
    cached.write_text(json.dumps(data))
    assert load_config_cached(path, cache).runtime.default_kind == "example.com/marker"
    path.write_text("runtime:\n  accept_env_unprivileged: false\n")     # changed: validated again
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    config = load_config_cached(path, cache)
    assert config.runtime.accept_env_unprivileged is False and config.runtime.default_kind == "nvidia.com/gpu"


def test_cache_never_hides_an_invalid_file(tmp_path):
    path, cache = tmp_path / "c.yaml", tmp_path / "cache"
    path.write_text("runtime:\n  bogus: 1\n")
    with pytest.raises(ConfigError):
        load_config_cached(path, cache)
    assert not cache.exists() or not list(cache.iterdir())


def test_sections_of_other_features_are_part_of_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  accept_env_unprivileged: true\ndaemon:\n  resync_interval: 5\n")
    config = load_config(path)
    assert config.section("daemon")["resync_interval"] == 5
    assert config.section("api")["socket"] == "/run/hostagent/hostagent.sock"     # defaults filled in
    path.write_text("daemon:\n  resync_interval: -1\n")
    with pytest.raises(ConfigError, match="daemon.resync_interval"):
        load_config(path)


@pytest.mark.parametrize("text, docs", [
    ("runtime: {default_kind: 1}\n", "see docs/runtime.md for"),
    ("api: {max_connections: 0}\n", "see docs/daemon.md for"),
    ("allocations: {max_per_device: 0}\n", "see docs/daemon.md for"),
    ("health: {nope: 1}\nmetrics: {nope: 1}\n", "see docs/health.md and docs/metrics.md for"),
    ("colour: blue\n", "see docs/daemon.md for"),
])
def test_the_hint_names_the_doc_of_each_section_in_error(tmp_path, text, docs):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.hint.startswith(docs), e.value.hint
