"""A write removes what killed writers of the same file left behind: only temporaries of
that exact name pattern, owned by the writing user, whose writer pid no longer runs."""

import os
import subprocess
import sys

import pytest

from hostagent.fileio import remove_stale_temporaries, temp_path, write_atomic
from tests.waiting import until


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def test_only_stale_temporaries_of_the_same_target_are_removed(tmp_path, sleeper):
    gone = dead_pid()
    stale = [f".spec.json.{gone}-0a1b2c3d.tmp", f".spec.json.{gone}-ffffffff.tmp"]
    kept = [f".spec.json.{sleeper}-0a1b2c3d.tmp",        # a writer still running
            f".other.json.{gone}-0a1b2c3d.tmp",          # another target's
            f".spec.json.{gone}-0a1b2c3d.tmp.bak",        # not the pattern
            f".spec.json.{gone}-0a1b2c3.tmp", f".spec.json.{gone}0a1b2c3d.tmp",
            f".spec.json.x{gone}-0a1b2c3d.tmp", "spec.json.tmp", ".spec.json.tmp"]
    for name in stale + kept:
        (tmp_path / name).write_text("half")
    (tmp_path / f".spec.json.{gone}-00000000.tmp").mkdir()      # a directory is never removed
    kept.append(f".spec.json.{gone}-00000000.tmp")
    write_atomic(tmp_path / "spec.json", "{}")
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["spec.json"])
    assert (tmp_path / "spec.json").read_text() == "{}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file another owner")
def test_temporaries_of_other_users_are_left_alone(tmp_path):
    name = f".spec.json.{dead_pid()}-0a1b2c3d.tmp"
    (tmp_path / name).write_text("half")
    os.chown(tmp_path / name, 65534, 65534)
    assert remove_stale_temporaries(str(tmp_path), "spec.json") == []
    assert (tmp_path / name).exists()


def test_a_symlink_with_the_pattern_is_not_followed_or_removed(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep")
    name = f".spec.json.{dead_pid()}-0a1b2c3d.tmp"
    (tmp_path / name).symlink_to(target)
    assert remove_stale_temporaries(str(tmp_path), "spec.json") == []
    assert target.read_text() == "keep" and (tmp_path / name).is_symlink()


def test_temp_names_carry_the_writer_pid_and_match_the_pattern(tmp_path):
    path = temp_path(str(tmp_path), "config.toml")
    name = os.path.basename(path)
    assert name.startswith(f".config.toml.{os.getpid()}-") and name.endswith(".tmp")
    assert temp_path(str(tmp_path), "config.toml") != path


def test_a_killed_writer_leaves_a_temporary_that_the_next_write_removes(tmp_path):
    # The writer is killed between creating its temporary and renaming it.
    code = ("import os, sys\n"
            "from hostagent import fileio\n"
            "real = os.replace\n"
            "def die(*a):\n"
            "    os.kill(os.getpid(), 9)\n"
            "os.replace = die\n"
            f"fileio.write_atomic({str(tmp_path / 'config.toml')!r}, 'new')\n")
    done = subprocess.run([sys.executable, "-c", code])
    assert done.returncode == -9
    left = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(left) == 1 and not (tmp_path / "config.toml").exists()
    write_atomic(tmp_path / "config.toml", "newer")
    assert os.listdir(tmp_path) == ["config.toml"]


def test_a_killed_writer_not_yet_reaped_counts_as_gone(tmp_path):
    code = ("import os\n"
            "from hostagent import fileio\n"
            "os.replace = lambda *a: os.kill(os.getpid(), 9)\n"
            f"fileio.write_atomic({str(tmp_path / 'spec.json')!r}, 'new')\n")
    writer = subprocess.Popen([sys.executable, "-c", code])
    try:
        def dead_with_its_temporary():           # a zombie, its temporary left
            left = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
            with open(f"/proc/{writer.pid}/stat") as f:
                return left if f.read().rsplit(")", 1)[1].split()[0] == "Z" else None
        [left] = until(dead_with_its_temporary, 20, "the writer killed, not reaped, its temporary left")
        assert left.startswith(f".spec.json.{writer.pid}-") and not (tmp_path / "spec.json").exists()
        write_atomic(tmp_path / "spec.json", "newer")
        assert os.listdir(tmp_path) == ["spec.json"]
    finally:
        writer.wait()


def test_commands_with_nothing_to_write_sweep_too(tmp_path):
    """cdi refresh and runtime configure that find their files as wanted still remove what
    a writer killed before its rename left beside them; a dry run leaves them."""
    from hostagent.cli.main import main
    from hostagent.sim.rootdir import build_node
    root = tmp_path / "node"
    build_node(str(root), "t4x2", engines=("containerd",))
    cdi = root / "var/run/cdi"
    config = root / "etc/containerd"
    commands = {cdi: ["cdi", "refresh"], config: ["runtime", "configure", "--runtime", "containerd"]}
    for folder, command in commands.items():
        assert main(["--simulate", str(root), *command]) == 0
        names = [p.name for p in folder.rglob("*") if p.is_file()]
        stale = [p.parent / f".{p.name}.{dead_pid()}-0a1b2c3d.tmp" for p in folder.rglob("*") if p.is_file()]
        for path in stale:
            path.write_text("half")
        assert main(["--simulate", str(root), *command, "--dry-run"]) == 0
        assert all(p.exists() for p in stale)
        assert main(["--simulate", str(root), *command]) == 0
        assert not any(p.exists() for p in stale) and sorted(p.name for p in folder.rglob("*") if p.is_file()) == \
            sorted(names)
