"""CDI's version and validation rules, on spec documents alone."""

import pytest

from hostagent.cdi.render import render
from hostagent.cdi.validate import check_kind, validate_spec
from hostagent.cdi.version import minimum_version
from hostagent.errors import UsageError

import yaml


def spec(**over):
    base = {"cdiVersion": "0.3.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]}
    base.update(over)
    return base


def dev(name, **edits):
    return {"name": name, "containerEdits": edits or {"deviceNodes": [{"path": "/dev/x"}]}}


@pytest.mark.parametrize("doc, version", [
    (spec(), "0.3.0"),
    (spec(containerEdits={"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}), "0.4.0"),
    (spec(devices=[dev("0")]), "0.5.0"),
    (spec(devices=[dev("gpu0", deviceNodes=[{"path": "/dev/x", "hostPath": "/dev/x"}])]), "0.5.0"),
    (spec(kind="nvidia.com/gpu.mig"), "0.6.0"),
    (spec(annotations={"a": "b"}), "0.6.0"),
    (spec(containerEdits={"additionalGids": [44]}), "0.7.0"),
    (spec(containerEdits={"intelRdt": {}}), "0.7.0"),
    (spec(containerEdits={"netDevices": [{"hostInterfaceName": "a", "name": "b"}]}), "1.1.0"),
])
def test_minimum_version_follows_the_library_rule(doc, version):
    assert minimum_version(doc) == version


@pytest.mark.parametrize("kind", ["x/gpu", "nvidia.com/g", "nvidia.com", "-bad/gpu", "nvidia.com/gpu-"])
def test_bad_kinds_are_refused_including_one_character_parts(kind):
    with pytest.raises(UsageError):
        check_kind(kind)
    assert validate_spec(spec(kind=kind))


@pytest.mark.parametrize("doc, fragment", [
    (spec(cdiVersion="0.2.0"), "not a known CDI version"),
    (spec(devices=[]), "at least one device"),
    (spec(devices=[dev("gpu0"), dev("gpu0")]), "duplicate device 'gpu0'"),
    (spec(devices=[dev("bad/name")]), "devices[0].name"),
    (spec(devices=[{"name": "gpu0", "containerEdits": {}}]), "non-empty edits"),
    (spec(devices=[{"name": "gpu0", "containerEdits": {"env": []}}]), "devices[0].containerEdits: a device needs non-empty"),
    (spec(devices=[{"name": "gpu0", "containerEdits": {"env": [], "mounts": [], "hooks": []}}]), "empty device edits"),
    (spec(devices=[{"name": "gpu0"}]), "devices[0].containerEdits: a device needs non-empty"),
    (spec(kind="a" * 254 + "/gpu"), "vendor has 254 characters; the CDI specification allows at most 253"),
    (spec(kind="nvidia.com/" + "g" * 64), "class has 64 characters; the CDI specification allows at most 63"),
    (spec(containerEdits={"deviceNodes": [{"path": True}]}), "deviceNodes[0].path: True is not a string"),
    (spec(containerEdits={"mounts": [{"hostPath": "/a", "containerPath": 1000.0}]}), "containerPath: 1000.0 is not a string"),
    (spec(containerEdits={"hooks": [{"hookName": "createContainer", "path": "/h", "args": ["/h", 16]}]}), "args: must be a list of strings"),
    (spec(devices=[dev("0")]), "needs 0.5.0 or newer"),
    (spec(annotations={"a": "b"}), "spec.annotations: needs cdiVersion 0.6.0"),
    (spec(containerEdits={"env": ["=1"]}), "containerEdits.env[0]"),
    (spec(containerEdits={"deviceNodes": [{"path": "/d", "permissions": "rwx"}]}), "not a subset of 'rwm'"),
    (spec(containerEdits={"deviceNodes": [{"path": "/d", "type": "x"}]}), "deviceNodes[0].type"),
    (spec(containerEdits={"mounts": [{"hostPath": "/a"}]}), "mounts[0].containerPath: required"),
    (spec(containerEdits={"hooks": [{"hookName": "preStart", "path": "/h"}]}), "hooks[0].hookName"),
    (spec(containerEdits={"hooks": [{"hookName": "createContainer", "path": "h"}]}), "absolute path"),
    (spec(containerEdits={"hooks": [{"hookName": "createContainer", "path": "/h", "timeout": 0}]}), "timeout"),
    (spec(bogus=1), "unknown field 'bogus'"),
])
def test_validation_names_the_problem_and_its_place(doc, fragment):
    assert any(fragment in p for p in validate_spec(doc)), validate_spec(doc)


def test_a_leading_v_is_valid_with_a_warning_for_older_readers():
    from hostagent.cdi.validate import spec_warnings
    doc = spec(cdiVersion="v0.5.0", devices=[dev("0")])
    assert validate_spec(doc) == []
    assert any("leading 'v'" in w and "0.5.4" in w for w in spec_warnings(doc))
    assert spec_warnings(spec()) == []


def test_valid_spec_has_no_problems():
    assert validate_spec(spec()) == []
    assert validate_spec(spec(devices=[dev("gpu0", env=["A=1"], mounts=[])])) == []


YAML_SPEC = """cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
- name: {name}
  containerEdits:
    env: [{env}]
    deviceNodes: [{{path: {path}, type: c, major: 0xc3, minor: 1_0, fileMode: 0666}}]
"""


@pytest.mark.parametrize("name, env, path, problems", [
    ("0:1", "A=1", "/dev/nvidia0", []),                          # go-yaml reads 0:1 as a string
    ('"1e3"', "'A=yes'", "'on'", []),
    ("1e3", "A=1", "/dev/x", ["devices[0].name: unquoted '1e3' is read as a float"]),
    ("gpu0", "yes", "/dev/x", ["devices[0].containerEdits.env[0]: unquoted 'yes' is read as a bool"]),
    ("0x10", "A=1", "on", ["devices[0].name: unquoted '0x10' is read as a int",
                           "devices[0].containerEdits.deviceNodes[0].path: unquoted 'on' is read as a bool"]),
    ("gpu0", "0o17", "null", ["devices[0].containerEdits.env[0]: unquoted '0o17' is read as a int",
                              "devices[0].containerEdits.deviceNodes[0].path: unquoted 'null' is read as a null"]),
])
def test_yaml_scalars_are_read_as_the_cdi_library_types_them(tmp_path, name, env, path, problems):
    from hostagent.cdi.validate import read_spec
    file = tmp_path / "spec.yaml"
    file.write_text(YAML_SPEC.format(name=name, env=env, path=path))
    doc, found = read_spec(file)
    assert [p.split(" by YAML 1.1")[0] for p in found] == problems
    node = doc["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert (node["major"], node["minor"], node["fileMode"]) == (195, 10, 0o666)    # numbers as go-yaml reads them
    if not problems:
        assert validate_spec(doc) == []
    else:
        assert validate_spec(doc)            # the typed value fails the Go rules too


def test_yaml_output_quotes_every_string_so_yaml_1_1_cannot_retype_it():
    doc = spec(devices=[dev("0"), dev("1e3"), dev("yes")], containerEdits={"env": ["A=0o17"]})
    text = render(doc, "yaml")
    assert yaml.safe_load(text) == doc
    assert '"1e3"' in text and '"yes"' in text and "&id" not in text


def test_name_rules_match_the_cdi_patterns():
    """VENDOR_RE/DEVICE_RE (character sets, no re at import) accept exactly what CDI's
    patterns accept, on every short string over the characters that matter."""
    import itertools
    import re
    from hostagent.cdi.validate import DEVICE_RE, VENDOR_RE
    vendor = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
    device = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
    for n in range(0, 6):
        for chars in itertools.product("aZ0_.:-/", repeat=n):
            name = "".join(chars)
            assert VENDOR_RE.match(name) == bool(vendor.fullmatch(name)), name
            assert DEVICE_RE.match(name) == bool(device.fullmatch(name)), name
    assert not DEVICE_RE.match("0\n")          # a pattern's $ would let this through
