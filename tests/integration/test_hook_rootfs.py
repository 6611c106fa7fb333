"""The container root itself as the attack: a bundle whose rootfs is, or passes through, a
symlink to a host directory laid out like a container root (so links and ld.so.cache would
land there), also when the rootfs is swapped for such a link while the hook runs. The hook
opens the root once without following any symlink and works relative to that descriptor."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from .test_hook_security import LINKS, World, flipper, prepare_args, world  # noqa: F401 - the fixture


def hook_args():
    """The fullest run this machine allows: links and the ldconfig sandbox as root."""
    if os.geteuid() == 0:
        return prepare_args(*LINKS)
    return ["create-symlinks", *sum((["--link", link] for link in LINKS), [])]


def victim(world: World):
    """A host directory that looks like a container root (the hook would write into it)."""
    target = world.outside / "victim"
    shutil.copytree(world.root, target, symlinks=True)
    return target


def refused(world: World, proc, needle="symlink"):
    assert proc.returncode != 0, proc.stderr.decode()
    assert needle in proc.stderr.decode(), proc.stderr.decode()
    assert proc.stderr.decode().count("\n") == 1
    world.assert_untouched()


def test_a_rootfs_that_is_a_symlink_is_refused(world):
    target = victim(world)
    shutil.rmtree(world.root)
    world.root.symlink_to(target)
    world.seal()
    refused(world, world.run(*hook_args()))


def test_a_relative_root_through_a_symlinked_directory_is_refused(world):
    victim(world)
    (world.bundle / "via").symlink_to(world.outside)
    (world.bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "via/victim"}}))
    world.seal()
    refused(world, world.run(*hook_args()))


def test_a_relative_root_climbing_out_of_the_bundle_is_refused(world):
    victim(world)
    rel = os.path.relpath(world.outside / "victim", world.bundle)
    (world.bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": rel}}))
    world.seal()
    refused(world, world.run(*hook_args()), "'..'")


@pytest.mark.parametrize("where", ["config", "state"])
def test_an_absolute_root_through_a_symlink_is_refused(world, where):
    victim(world)
    (world.tmp / "alias").symlink_to(world.outside)
    path = str(world.tmp / "alias" / "victim")
    if where == "config":
        (world.bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": path}}))
        stdin = None
    else:                                          # crun's own "root" field in the state
        stdin = world.state(root=path)
    world.seal()
    refused(world, world.run(*hook_args(), stdin=stdin))


def test_an_absolute_root_without_symlinks_is_used(world):
    (world.bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": str(world.root)}}))
    world.seal()
    proc = world.run(*hook_args())
    assert proc.returncode == 0, proc.stderr.decode()
    assert os.readlink(world.at(LINKS[0].split("::")[1])) == LINKS[0].split("::")[0]
    world.assert_untouched()


def test_a_rootfs_swapped_for_a_symlink_while_the_hook_runs(world):
    victim(world)
    world.seal()
    # Exchanges bundle/rootfs and a symlink to the look-alike host directory, atomically, in
    # a tight loop, while whole runs of the hook program go on.
    pid = flipper(world.root, world.outside / "victim")
    outcomes = {"inside": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 6
        runs = 0
        while runs < 12 and time.monotonic() < deadline:
            runs += 1
            proc = world.run(*hook_args())
            outcomes["inside" if proc.returncode == 0 else "refused"] += 1
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert runs >= 3, outcomes
    world.assert_untouched()
