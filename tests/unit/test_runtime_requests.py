"""GPU requests of an OCI config, and runc-style command lines."""

import pytest

from hostagent.config import load_config
from hostagent.errors import UsageError
from hostagent.runtime.requests import gpu_requests, parse_call

DEFAULTS = load_config("/nonexistent").runtime
ENV_OK = DEFAULTS._replace(accept_env_unprivileged=True)
PRIVILEGED = {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}


def oci(env=(), annotations=None, mounts=(), caps=None):
    process = {"env": ["PATH=/bin", *env]}
    if caps:
        process["capabilities"] = caps
    out = {"process": process, "mounts": list(mounts)}
    if annotations:
        out["annotations"] = annotations
    return out


@pytest.mark.parametrize("argv, command, bundle", [
    (["--root", "/run/runc", "--log", "/l.json", "--log-format", "json", "create", "--bundle", "/b", "id"],
     "create", "/b"),
    (["--systemd-cgroup", "create", "-b", "/b2", "--pid-file", "/p", "id"], "create", "/b2"),
    (["create", "--bundle=/b3", "id"], "create", "/b3"),
    (["create", "id"], "create", "."),
    (["--root=/x", "start", "id"], "start", None),
    (["--root", "create", "delete", "id"], "delete", None),     # "create" was --root's value
    (["--version"], None, None),
])
def test_parse_call(argv, command, bundle):
    call = parse_call(argv)
    assert (call.command, call.bundle) == (command, bundle)


def test_env_is_ignored_for_unprivileged_containers_by_default():
    assert not gpu_requests(oci(env=["NVIDIA_VISIBLE_DEVICES=0"]), DEFAULTS)
    r = gpu_requests(oci(env=["NVIDIA_VISIBLE_DEVICES=0"], caps=PRIVILEGED), DEFAULTS)
    assert (r.source, r.devices) == ("env", ("nvidia.com/gpu=0",))
    # Only the bounding set counts.
    assert not gpu_requests(oci(env=["NVIDIA_VISIBLE_DEVICES=0"], caps={"effective": ["CAP_SYS_ADMIN"]}), DEFAULTS)


@pytest.mark.parametrize("value, devices, driver_only", [
    ("all", ("nvidia.com/gpu=all",), ()),
    ("0,1", ("nvidia.com/gpu=0", "nvidia.com/gpu=1"), ()),
    (" GPU-5dcbd089-0ae4-5f70-97f6-36c8727b3ae8 ", ("nvidia.com/gpu=GPU-5dcbd089-0ae4-5f70-97f6-36c8727b3ae8",), ()),
    ("1:0,MIG-1a2b", ("nvidia.com/gpu=1:0", "nvidia.com/gpu=MIG-1a2b"), ()),
    ("other.com/gpu=3", ("other.com/gpu=3",), ()),
    ("none", (), ("nvidia.com/gpu",)),
    ("void", (), ()),
    ("", (), ()),
])
def test_env_values(value, devices, driver_only):
    r = gpu_requests(oci(env=[f"NVIDIA_VISIBLE_DEVICES={value}"]), ENV_OK)
    assert (r.devices, r.driver_only_kinds) == (devices, driver_only)


def test_last_env_entry_wins():
    r = gpu_requests(oci(env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=void"]), ENV_OK)
    assert not r


def test_annotations_come_first_sorted_by_key():
    cfg = oci(env=["NVIDIA_VISIBLE_DEVICES=all"], caps=PRIVILEGED,
              annotations={"cdi.k8s.io/z": "nvidia.com/gpu=1", "cdi.k8s.io/a": "nvidia.com/gpu=0, nvidia.com/gpu=2",
                           "other/x": "nvidia.com/gpu=7"},
              mounts=[{"destination": "/var/run/nvidia-container-devices/3", "source": "/dev/null"}])
    r = gpu_requests(cfg, DEFAULTS)
    assert (r.source, r.devices) == ("annotations", ("nvidia.com/gpu=0", "nvidia.com/gpu=2", "nvidia.com/gpu=1"))


def test_mount_markers_before_env():
    marks = [{"destination": "/var/run/nvidia-container-devices/" + d, "source": "/dev/null", "type": "bind"}
             for d in ("0", "cdi/example.com/gpu/1", "cdi/example.com/gpu=2", "imex/5")]
    marks.append({"destination": "/var/run/nvidia-container-devices/9", "source": "/tmp/x"})   # not /dev/null
    r = gpu_requests(oci(env=["NVIDIA_VISIBLE_DEVICES=all"], caps=PRIVILEGED, mounts=marks), DEFAULTS)
    assert (r.source, r.devices) == ("mounts", ("nvidia.com/gpu=0", "example.com/gpu=1", "example.com/gpu=2"))
    off = DEFAULTS._replace(accept_volume_mounts=False)
    assert gpu_requests(oci(mounts=marks), off).source == ""


def test_invalid_names_are_refused():
    with pytest.raises(UsageError, match="annotation cdi.k8s.io/a: 'gpu0' is not a fully qualified"):
        gpu_requests(oci(annotations={"cdi.k8s.io/a": "gpu0"}), DEFAULTS)
    with pytest.raises(UsageError, match="NVIDIA_VISIBLE_DEVICES"):
        gpu_requests(oci(env=["NVIDIA_VISIBLE_DEVICES=0/1"]), ENV_OK)


def test_no_request():
    assert gpu_requests({}, ENV_OK).source == ""
    assert not gpu_requests(oci(), ENV_OK)


def test_qualified_names_follow_the_cdi_rule():
    """is_qualified agrees with CDI's rule written as a regular expression, on every
    short string over the characters that matter."""
    import itertools
    import re
    from hostagent.runtime.requests import is_qualified
    part = r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
    rule = re.compile(rf"^{part}/{part}=[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
    alphabet = "a0_.:-/="
    for n in range(1, 7):
        for chars in itertools.product(alphabet, repeat=n):
            name = "".join(chars)
            assert is_qualified(name) == bool(rule.match(name)), name
    for name in ("nvidia.com/gpu=0", "nvidia.com/gpu=GPU-4f3a", "nvidia.com/gpu=1:0", "vendor.example/gpu=all"):
        assert is_qualified(name)
    for name in ("nvidia.com/gpu", "gpu0", "nvidia.com/gpu=", "nvidia.com/gpu=0=1", "nvidia.com/g/pu=0",
                 "nvidia.com/gpu=0\n", "nvidia.com/gpu=é"):
        assert not is_qualified(name)
