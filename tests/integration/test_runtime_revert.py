"""runtime revert after any sequence of configures: every file as it was before hostagent."""

import json
import shutil
from pathlib import Path

import pytest

from hostagent.cli.main import main
from hostagent.errors import StateError
from hostagent.runtime.configure import apply_plan, plan_configure
from hostagent.runtime.engine import Settings
from hostagent.sim.platform import simulated_host

INPUTS = Path(__file__).parent / "golden" / "runtime" / "inputs"


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    for d in ("etc/containerd", "etc/crio", "etc/docker", "other"):
        (root / d).mkdir(parents=True)
    shutil.copyfile(INPUTS / "containerd-comments-v2.toml", root / "etc/containerd/config.toml")
    shutil.copyfile(INPUTS / "containerd-site-v2.toml", root / "etc/containerd/site.toml")
    shutil.copyfile(INPUTS / "containerd-default-v2.toml", root / "other/config.toml")
    shutil.copyfile(INPUTS / "crio.conf", root / "etc/crio/crio.conf")
    shutil.copyfile(INPUTS / "daemon.json", root / "etc/docker/daemon.json")
    return root


def tree(root: Path) -> dict:
    """Every file and folder under root, hostagent's own state aside."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if p.relative_to(root).parts[:1] not in (("run",), ("var",))}


def runtime(root, tmp_path, *args):
    return main(["--simulate", str(root), "runtime", *args, "--backup-dir", str(tmp_path / "b")])


def configure(root, tmp_path, engine, *args):
    return runtime(root, tmp_path, "configure", "--runtime", engine, *args)


def revert(root, tmp_path, engine, *args):
    return runtime(root, tmp_path, "revert", "--runtime", engine, *args)


@pytest.mark.parametrize("engine, sequence", [
    ("containerd", [[], ["--cdi"]]),
    ("containerd", [[], ["--cdi"], ["--set-as-default"], ["--runtime-name", "gpu"]]),
    ("containerd", [["--no-drop-in"], ["--no-drop-in", "--cdi"]]),
    ("containerd", [["--drop-in", "/etc/containerd/conf.d/50-a.toml"], ["--drop-in", "/etc/containerd/gpu.d/x.toml"]]),
    # two main files, one backup
    ("containerd", [[], ["--config", "/other/config.toml", "--cdi"], ["--config", "/other/config.toml"]]),
    ("crio", [[], ["--set-as-default"], ["--drop-in", "/etc/crio/crio.conf.d/50-gpu.conf"]]),
    ("docker", [[], ["--cdi", "--set-as-default"], []]),
])
def test_one_revert_undoes_any_sequence(root, tmp_path, capsys, engine, sequence):
    before = tree(root)
    for args in sequence:
        assert configure(root, tmp_path, engine, *args) == 0
    assert tree(root) != before
    capsys.readouterr()
    assert revert(root, tmp_path, engine) == 0
    assert tree(root) == before                        # files byte for byte, no folder left behind
    capsys.readouterr()
    assert revert(root, tmp_path, engine) == 1
    assert "no backup to restore" in capsys.readouterr().err


def test_created_folder_with_other_files_is_kept(root, tmp_path):
    assert configure(root, tmp_path, "containerd") == 0
    (root / "etc/containerd/conf.d/50-site.toml").write_text("# the admin's\n")
    assert revert(root, tmp_path, "containerd") == 0
    assert [p.name for p in (root / "etc/containerd/conf.d").iterdir()] == ["50-site.toml"]


def test_existing_folder_is_kept(root, tmp_path):
    (root / "etc/containerd/conf.d").mkdir()
    assert configure(root, tmp_path, "containerd") == 0
    assert revert(root, tmp_path, "containerd") == 0
    assert (root / "etc/containerd/conf.d").is_dir()


def test_dry_run_revert_changes_nothing(root, tmp_path, capsys):
    assert configure(root, tmp_path, "containerd") == 0
    after = tree(root)
    capsys.readouterr()
    assert revert(root, tmp_path, "containerd", "--dry-run") == 0
    out = capsys.readouterr().out
    assert '+imports = ["/etc/containerd/site.toml"]' in out and "+++ /dev/null" in out and "would remove" in out
    assert tree(root) == after


def test_a_change_by_someone_else_is_kept_and_revert_restores_the_original(root, tmp_path, capsys):
    original = (root / "etc/docker/daemon.json").read_bytes()
    assert configure(root, tmp_path, "docker") == 0
    daemon = root / "etc/docker/daemon.json"
    edited = daemon.read_text().replace("json-file", "journald")
    daemon.write_text(edited)
    capsys.readouterr()
    assert configure(root, tmp_path, "docker", "--cdi") == 0
    err = capsys.readouterr().err
    assert "changed since hostagent wrote it" in err and "0.replaced-1" in err
    assert revert(root, tmp_path, "docker") == 0
    assert daemon.read_bytes() == original
    assert (tmp_path / "b/docker/0.replaced-1").read_text() == edited      # the other version stays


def test_failed_configure_keeps_the_earlier_backup(root, tmp_path):
    before = tree(root)
    assert configure(root, tmp_path, "containerd") == 0
    drop_in = root / "etc/containerd/conf.d/99-hostagent.toml"
    written = drop_in.read_text()
    plan = plan_configure(simulated_host(root), "containerd", Settings(cdi=True))
    with pytest.raises(StateError):
        apply_plan(plan, tmp_path / "b" / "containerd", before_rename=lambda: drop_in.write_text("# meanwhile\n"))
    drop_in.write_text(written)
    assert revert(root, tmp_path, "containerd") == 0
    assert tree(root) == before


def manifest(tmp_path, engine="docker") -> Path:
    return tmp_path / "b" / engine / "manifest.json"


@pytest.mark.parametrize("damage, message", [
    (lambda m: m.write_text("{"), "the backup manifest is damaged: not JSON"),
    (lambda m: m.write_text("[]"), "the backup manifest is damaged: no list of files"),
    (lambda m: m.write_text(json.dumps({"version": 2, "files": [
        {k: v for k, v in json.loads(m.read_text())["files"][0].items() if k != "written_sha256"}]})),
     "the backup manifest is damaged: files[0] lacks 'written_sha256'"),
    (lambda m: m.write_text(json.dumps({"version": 2, "files": ["x"]})), "files[0] is not an object"),
    (lambda m: (m.parent / "0.orig").unlink(), "0.orig: the saved original of /etc/docker/daemon.json is missing"),
])
def test_damaged_backup_is_a_clear_error(root, tmp_path, capsys, damage, message):
    assert configure(root, tmp_path, "docker") == 0
    damage(manifest(tmp_path))
    after = tree(root)
    capsys.readouterr()
    assert revert(root, tmp_path, "docker") == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert tree(root) == after


def test_backup_of_the_first_format_is_restored(root, tmp_path):
    """A backup written before revert kept every file's original: one configure's files."""
    original = (root / "etc/docker/daemon.json").read_bytes()
    assert configure(root, tmp_path, "docker") == 0
    m = manifest(tmp_path)
    entry = json.loads(m.read_text())["files"][0]
    m.write_text(json.dumps({"files": [{"path": entry["path"], "real": entry["real"], "existed": True,
                                        "written_sha256": entry["written_sha256"][0], "backup": "0.orig"}]}))
    assert revert(root, tmp_path, "docker") == 0
    assert (root / "etc/docker/daemon.json").read_bytes() == original
