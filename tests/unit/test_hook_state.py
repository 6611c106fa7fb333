"""OCI state and bundle: strict JSON without the json module, and where the root is."""

import json
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings, strategies as st

from hostagent.hooks import jsonmini, ocistate
from hostagent.hooks.errors import HookError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_jsonmini_decodes_what_json_encodes(value):
    assert jsonmini.loads(json.dumps(value).encode()) == value
    assert jsonmini.loads(b" \n" + json.dumps(value, indent=2).encode() + b"\r\n\t") == value


@pytest.mark.parametrize("data, reason", [
    (b"", "Expecting value"), (b"{", "Expecting property name"), (b'{"a": 1} {}', "Extra data"),
    (b"NaN", "NaN is not JSON"), (b'{"x": -Infinity}', "-Infinity is not JSON"), (b"[1,]", "Expecting value"),
    (b"\xff\xfe", "not UTF-8"), (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_jsonmini_rejects_anything_else_with_a_reason(data, reason):
    with pytest.raises(ValueError, match=reason):
        jsonmini.loads(data)


def test_jsonmini_does_not_import_json_for_valid_documents():
    code = ("import sys; from hostagent.hooks.jsonmini import loads; loads(b'{\"a\": [1, 2.5]}'); "
            "print('json' in sys.modules, 're' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_jsonmini_falls_back_to_json_without_the_c_scanner(monkeypatch):
    monkeypatch.setitem(sys.modules, "_json", None)
    assert jsonmini.loads(b'{"root": {"path": "rootfs"}}') == {"root": {"path": "rootfs"}}
    with pytest.raises(ValueError, match="NaN is not JSON"):
        jsonmini.loads(b"NaN")


def feed(data: bytes) -> int:
    """A pipe like the engine's stdin; the writer is a thread so large inputs cannot block."""
    r, w = os.pipe()

    def write():
        try:
            os.write(w, data)
        except BrokenPipeError:
            pass
        finally:
            os.close(w)
    threading.Thread(target=write, daemon=True).start()
    return r


def test_read_state_bounds_size_and_type():
    fd = feed(b'{"ociVersion": "1.0.2", "bundle": "/b"}')
    assert ocistate.read_state(fd) == {"ociVersion": "1.0.2", "bundle": "/b"}
    with pytest.raises(HookError, match="larger than"):
        ocistate.read_state(feed(b" " * (ocistate.MAX_STATE + 1)))
    with pytest.raises(HookError, match="not valid JSON"):
        ocistate.read_state(feed(b"garbage"))
    with pytest.raises(HookError, match="not a JSON object"):
        ocistate.read_state(feed(b'["bundle", "/b"]'))


@pytest.fixture
def bundle(tmp_path):
    (tmp_path / "rootfs").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}))
    return tmp_path


def test_relative_root_path_is_joined_to_the_bundle(bundle):
    assert ocistate.read_bundle({"bundle": str(bundle)})[0] == str(bundle / "rootfs")


def test_absolute_root_path_and_crun_root_field(bundle, tmp_path_factory):
    other = tmp_path_factory.mktemp("elsewhere")
    (bundle / "config.json").write_text(json.dumps({"root": {"path": str(other)}}))
    assert ocistate.read_bundle({"bundle": str(bundle)})[0] == str(other)
    assert ocistate.read_bundle({"bundle": str(bundle), "root": "/run/crun/x/rootfs"})[0] == "/run/crun/x/rootfs"


@pytest.mark.parametrize("state, message", [
    ({}, "no bundle path"),
    ({"bundle": 7}, "no bundle path"),
    ({"bundle": "relative/bundle"}, "not an absolute path"),
    ({"bundle": "/nonexistent/bundle"}, "does not exist"),
])
def test_bad_bundles_are_refused(state, message):
    with pytest.raises(HookError, match=message):
        ocistate.read_bundle(state)


@pytest.mark.parametrize("config, message", [
    ("not json", "is not valid JSON"), ("[]", "not a JSON object"), ("{}", "has no root.path"),
    ('{"root": {"path": ""}}', "has no root.path"), ('{"root": "rootfs"}', "has no root.path"),
])
def test_bad_configs_are_refused(bundle, config, message):
    (bundle / "config.json").write_text(config)
    with pytest.raises(HookError, match=message):
        ocistate.read_bundle({"bundle": str(bundle)})


def test_relative_crun_root_is_joined_to_the_bundle(bundle):
    """crun 1.8 passes config.json's root.path as written, relative to the bundle."""
    assert ocistate.read_bundle({"bundle": str(bundle), "root": "rootfs"})[0] == str(bundle / "rootfs")


@pytest.mark.parametrize("root", ["", 7, "root\0fs"])
def test_bad_crun_roots_are_refused(bundle, root):
    with pytest.raises(HookError, match="not an absolute path"):
        ocistate.read_bundle({"bundle": str(bundle), "root": root})


def test_a_fifo_config_is_refused_without_hanging(bundle):
    (bundle / "config.json").unlink()
    os.mkfifo(bundle / "config.json")
    with pytest.raises(HookError, match="not a regular file"):
        ocistate.read_bundle({"bundle": str(bundle)})
