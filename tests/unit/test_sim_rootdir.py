"""Building a simulated node: a build that fails removes what it made (docs/simulator.md)."""

import pytest

from hostagent.errors import StateError
from hostagent.sim import driverroot
from hostagent.sim.rootdir import build_node


def failing_build(error):
    def create_node(root, profile, **options):
        (root / "usr/lib").mkdir(parents=True)        # part of a node, then the failure
        (root / "usr/lib/half-written").write_text("")
        raise error
    return create_node


def test_a_failed_build_removes_the_directories_it_created(tmp_path, monkeypatch):
    monkeypatch.setattr(driverroot, "create_node", failing_build(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        build_node(str(tmp_path / "a/b"), "t4x2")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_build_leaves_an_empty_directory_it_was_given_empty(tmp_path, monkeypatch):
    monkeypatch.setattr(driverroot, "create_node", failing_build(OSError(28, "No space left on device")))
    with pytest.raises(StateError, match="No space left on device"):
        build_node(str(tmp_path), "t4x2")
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []
