"""CDI injection into an OCI config: the CDI library's semantics and order."""

import json
import os
import stat
from types import SimpleNamespace

import pytest

from hostagent.cdi.cache import load_cache
from hostagent.cdi.inject import apply_edits, collect_edits, inject
from hostagent.errors import ConfigError, NotFoundError


def spec(kind="example.com/gpu", devices=None, common=None, version="0.5.0"):
    out = {"cdiVersion": version, "kind": kind,
           "devices": devices or [{"name": "0", "containerEdits": {"env": ["DEV=0"]}}]}
    if common:
        out["containerEdits"] = common
    return out


def node(path, minor, **kw):
    return {"path": path, "type": "c", "major": 195, "minor": minor, **kw}


def write_specs(folder, **files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    return folder


OCI = {
    "ociVersion": "1.0.2",
    "process": {"user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin", "DEV=old"]},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
               {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
               {"destination": "/usr/lib/x", "type": "bind", "source": "/old"}],
    "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1}],
              "resources": {"devices": [{"allow": False, "access": "rwm"}]}},
}


def test_env_is_replaced_by_name_or_appended():
    out = apply_edits(OCI, [{"env": ["DEV=0", "NEW=1"]}])
    assert out["process"]["env"] == ["PATH=/bin", "DEV=0", "NEW=1"]
    assert OCI["process"]["env"] == ["PATH=/bin", "DEV=old"]          # input untouched


def test_device_nodes_replace_same_path_and_get_cgroup_rules():
    out = apply_edits(OCI, [{"deviceNodes": [node("/dev/nvidia0", 0, fileMode=0o666, permissions="rw"),
                                             {"path": "/dev/fifo", "type": "p"}]}])
    assert out["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666},
        {"path": "/dev/fifo", "type": "p"}]
    # The deny-all rule stays first; only b/c nodes get an allow rule, with the node's access.
    assert out["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"}]


def test_default_access_is_rwm_and_owner_follows_a_non_root_user():
    cfg = dict(OCI, process={"user": {"uid": 1000, "gid": 1001}})
    out = apply_edits(cfg, [{"deviceNodes": [node("/dev/nvidia1", 1), node("/dev/nvidia2", 2, uid=0)]}])
    dev1, dev2 = out["linux"]["devices"][1:]
    assert (dev1["uid"], dev1["gid"]) == (1000, 1001)
    assert (dev2["uid"], dev2["gid"]) == (0, 1001)
    assert out["linux"]["resources"]["devices"][-1]["access"] == "rwm"


def test_mounts_replace_same_destination_and_sort_by_depth_stably():
    out = apply_edits(OCI, [{"mounts": [
        {"hostPath": "/h/lib", "containerPath": "/usr/lib/x", "options": ["ro", "bind"]},
        {"hostPath": "/h/sock", "containerPath": "/run/a", "type": "bind"},
        {"hostPath": "/h/bin", "containerPath": "/usr/bin/nvidia-smi"}]}])
    assert [m["destination"] for m in out["mounts"]] == [
        "/proc", "/dev", "/dev/pts", "/run/a", "/usr/lib/x", "/usr/bin/nvidia-smi"]
    lib = next(m for m in out["mounts"] if m["destination"] == "/usr/lib/x")
    assert lib == {"destination": "/usr/lib/x", "source": "/h/lib", "options": ["ro", "bind"]}


def test_hooks_are_appended_to_their_oci_list():
    cfg = dict(OCI, hooks={"createContainer": [{"path": "/existing"}]})
    out = apply_edits(cfg, [{"hooks": [
        {"hookName": "createContainer", "path": "/bin/hook", "args": ["hook", "a"], "env": ["A=1"]},
        {"hookName": "poststop", "path": "/bin/stop", "timeout": 5}]}])
    assert out["hooks"]["createContainer"] == [{"path": "/existing"},
                                               {"path": "/bin/hook", "args": ["hook", "a"], "env": ["A=1"]}]
    assert out["hooks"]["poststop"] == [{"path": "/bin/stop", "timeout": 5}]


def test_additional_gids_skip_zero():
    out = apply_edits(OCI, [{"additionalGids": [0, 44]}, {"additionalGids": [45]}])
    assert out["process"]["user"]["additionalGids"] == [44, 45]


def test_unset_node_fields_come_from_the_host():
    fake = os.stat_result((stat.S_IFCHR | 0o660, 0, 0, 1, 0, 0, 0, 0, 0, 0))
    fake_rdev = SimpleNamespace(st_mode=fake.st_mode, st_rdev=os.makedev(195, 7))
    out = apply_edits(OCI, [{"deviceNodes": [{"path": "/dev/nvidia7"}]}], lstat=lambda p: fake_rdev)
    assert out["linux"]["devices"][-1] == {"path": "/dev/nvidia7", "type": "c", "major": 195, "minor": 7,
                                           "fileMode": 0o660}


def test_host_node_errors(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="failed to stat CDI host device"):
        apply_edits(OCI, [{"deviceNodes": [{"path": "/dev/x", "hostPath": str(tmp_path / "missing")}]}])
    with pytest.raises(ConfigError, match="not a device node"):
        apply_edits(OCI, [{"deviceNodes": [{"path": "/dev/x", "hostPath": str(tmp_path / "file")}]}])
    chr_ = SimpleNamespace(st_mode=stat.S_IFCHR | 0o666, st_rdev=os.makedev(1, 3))
    with pytest.raises(ConfigError, match="host type mismatch"):
        apply_edits(OCI, [{"deviceNodes": [{"path": "/dev/x", "type": "b"}]}], lstat=lambda p: chr_)


def test_spec_edits_once_per_spec_before_its_first_device(tmp_path):
    a = spec("example.com/gpu", [{"name": "0", "containerEdits": {"env": ["D=0"]}},
                                 {"name": "1", "containerEdits": {"env": ["D=1"]}}], common={"env": ["COMMON=a"]})
    b = spec("example.com/nic", [{"name": "x", "containerEdits": {"env": ["N=x"]}}], common={"env": ["COMMON=b"]})
    cache = load_cache([write_specs(tmp_path / "cdi", **{"a.json": a, "b.json": b})])
    edits = collect_edits(cache, ["example.com/gpu=1", "example.com/nic=x", "example.com/gpu=0",
                                  "example.com/gpu=1"])
    assert [e["env"] for e in edits] == [["COMMON=a"], ["D=1"], ["COMMON=b"], ["N=x"], ["D=0"]]
    out = inject({"process": {"env": []}}, cache, ["example.com/gpu=0"])
    assert out["process"]["env"] == ["COMMON=a", "D=0"]


def test_unknown_device_names_it_and_the_offered_ones(tmp_path):
    cache = load_cache([write_specs(tmp_path / "cdi", **{"a.json": spec()})])
    with pytest.raises(NotFoundError) as e:
        inject(OCI, cache, ["example.com/gpu=0", "example.com/gpu=9"])
    assert "unresolvable CDI device example.com/gpu=9" in e.value.message
    assert "devices offered: example.com/gpu=0" in e.value.message


def test_driver_only_kind_applies_the_spec_edits_without_a_device(tmp_path):
    cache = load_cache([write_specs(tmp_path / "cdi", **{"a.json": spec(common={"env": ["LIBS=1"]})})])
    out = inject({"process": {"env": []}}, cache, [], driver_only_kinds=["example.com/gpu"])
    assert out["process"]["env"] == ["LIBS=1"]
    with pytest.raises(NotFoundError, match="no CDI spec of kind other.com/gpu"):
        inject(OCI, cache, [], driver_only_kinds=["other.com/gpu"])


def test_cache_priority_conflicts_and_bad_files(tmp_path):
    low = write_specs(tmp_path / "etc", **{"a.json": spec(devices=[{"name": "0", "containerEdits": {"env": ["FROM=etc"]}}])})
    high = write_specs(tmp_path / "run", **{
        "a.json": spec(devices=[{"name": "0", "containerEdits": {"env": ["FROM=run"]}},
                                {"name": "1", "containerEdits": {"env": ["X=1"]}}]),
        "b.json": spec(devices=[{"name": "1", "containerEdits": {"env": ["X=2"]}}]),
        "bad.json": {"cdiVersion": "0.5.0"},
        "ignored.yml": spec()})
    (high / "broken.json").write_text("{")
    cache = load_cache([low, high, tmp_path / "missing"])
    assert cache.devices["example.com/gpu=0"].edits == {"env": ["FROM=run"]}     # later dir wins
    assert "example.com/gpu=1" not in cache.devices                               # same dir: conflict
    errors = "\n".join(cache.errors)
    assert "conflicts with" in errors and "bad.json" in errors and "broken.json" in errors
    assert "ignored.yml" not in errors
