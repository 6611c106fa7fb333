"""prepare --from-spec: the node spec's own hook work, read from a file only root can write."""

from __future__ import annotations

import json
import os

import pytest

from hostagent.hooks import cli
from hostagent.hooks.errors import HookError, UsageError
from hostagent.hooks.nodespec import hook_args

BOOT = "import sys;sys.path.append('/x');from hostagent.hooks.main import main;sys.exit(main())"
SPEC_HOOK_ARGS = ["prepare", "--link", "libcuda.so.550.90.07::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                  "--device-link", "../card1::/dev/dri/by-path/pci-0000:3b:00.0-card",
                  "--folder", "/usr/lib/x86_64-linux-gnu", "--ldconfig-path", "/elsewhere/ldconfig"]


def write_spec(path, hooks, mode=0o644):
    path.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [],
                                "containerEdits": {"hooks": hooks}}))
    path.chmod(mode)
    return str(path)


def spec_hook(args=SPEC_HOOK_ARGS):
    return {"hookName": "createContainer", "path": "/usr/bin/python3",
            "args": ["/usr/bin/python3", "-I", "-S", "-c", BOOT, *args]}


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the spec must be owned by root: files made here are not")


@needs_root
def test_the_specs_hook_work_is_added_to_the_call(tmp_path):
    path = write_spec(tmp_path / "spec.json", [{"hookName": "createContainer", "path": "/bin/true"}, spec_hook()])
    req = cli.parse(["prepare", "--from-spec", path, "--folder", "/lib64"])
    assert req.from_spec == path
    assert cli.add_spec_work(req, hook_args(path)) == []
    assert req.links == [("libcuda.so.550.90.07", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")]
    assert req.device_links == [("../card1", "/dev/dri/by-path/pci-0000:3b:00.0-card")]
    assert req.folders == ["/lib64", "/usr/lib/x86_64-linux-gnu"]
    assert req.ldconfig_path == cli.DEFAULT_LDCONFIG          # the call's own, not the spec's


@needs_root
@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_a_spec_others_can_write_is_refused(tmp_path, mode):
    path = write_spec(tmp_path / "spec.json", [spec_hook()], mode)
    with pytest.raises(HookError, match="must be owned by root and writable by no one else"):
        hook_args(path)


def test_a_spec_not_owned_by_root_is_refused(tmp_path):
    path = write_spec(tmp_path / "spec.json", [spec_hook()])
    if os.geteuid() == 0:
        os.chown(path, 12345, 12345)
    with pytest.raises(HookError, match="owner uid"):
        hook_args(path)


def test_a_symlinked_spec_is_not_followed(tmp_path):
    real = write_spec(tmp_path / "spec.json", [spec_hook()])
    (tmp_path / "link.json").symlink_to(real)
    with pytest.raises(HookError, match="link.json"):
        hook_args(str(tmp_path / "link.json"))


@needs_root
@pytest.mark.parametrize("hooks, message", [
    ([], "no hostagent hook"),
    ([{"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "-c", "x"]}], "no hostagent hook"),
    ("not a list", "no hostagent hook"),
])
def test_a_spec_without_a_hostagent_hook_fails_with_a_clear_line(tmp_path, hooks, message):
    with pytest.raises(HookError, match=message):
        hook_args(write_spec(tmp_path / "spec.json", hooks))


@needs_root
def test_a_spec_hook_with_a_bad_link_fails_before_anything_is_done(tmp_path):
    path = write_spec(tmp_path / "spec.json", [spec_hook(["prepare", "--link", "no-separator"])])
    req = cli.parse(["prepare", "--from-spec", path])
    with pytest.raises(UsageError, match="TARGET::LINK"):
        cli.add_spec_work(req, hook_args(path))


def test_from_spec_needs_an_absolute_host_path():
    with pytest.raises(UsageError, match="absolute path on the host"):
        cli.parse(["prepare", "--from-spec", "var/run/cdi/x.json"])
    assert "--from-spec" in cli.USAGE
