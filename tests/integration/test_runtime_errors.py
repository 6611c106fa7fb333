"""runtime configure on bad input: a clear error, a non-zero exit, and no file changed."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostagent.cli.main import main
from hostagent.errors import StateError
from hostagent.runtime import files
from hostagent.runtime.configure import apply_plan, plan_configure
from hostagent.runtime.engine import Settings
from hostagent.sim.platform import simulated_host

INPUTS = Path(__file__).parent / "golden" / "runtime" / "inputs"


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    for d in ("etc/containerd", "etc/crio/crio.conf.d", "etc/docker"):
        (root / d).mkdir(parents=True)
    shutil.copyfile(INPUTS / "containerd-comments-v2.toml", root / "etc/containerd/config.toml")
    shutil.copyfile(INPUTS / "containerd-site-v2.toml", root / "etc/containerd/site.toml")     # its import
    shutil.copyfile(INPUTS / "daemon.json", root / "etc/docker/daemon.json")
    return root


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if p.relative_to(root).parts[:2] != ("run", "hostagent")
            and p.relative_to(root) != Path("run")}


def configure(root, tmp_path, *args):
    return main(["--simulate", str(root), "runtime", "configure", "--backup-dir", str(tmp_path / "b"), *args])


def write(root, path, text):
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


CONF_D = 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
CRI = '[plugins."io.containerd.grpc.v1.cri"]\n  max_concurrent_downloads = 7\n'
CRI_V2 = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'


def toolkit_drop_in_after_ours(r):
    write(r, "etc/containerd/config.toml", CONF_D)
    write(r, "etc/containerd/conf.d/99-nvidia.toml", (INPUTS / "containerd-99-nvidia-v2.toml").read_text())


def nested_import_after_ours(r):
    write(r, "etc/containerd/config.toml", CONF_D)
    write(r, "etc/containerd/conf.d/10-site.toml", 'imports = ["/etc/containerd/late.toml"]\n')
    write(r, "etc/containerd/late.toml", CRI)


@pytest.mark.parametrize("setup, args, code, message", [
    (lambda r: write(r, "etc/containerd/config.toml", "version = 2\n[plugins\n"),
     ["--runtime", "containerd"], 1, "config.toml:2:9: not valid TOML"),
    (lambda r: write(r, "etc/containerd/config.toml", "version = 4\n"),
     ["--runtime", "containerd"], 1, "unknown containerd config version 4"),
    (lambda r: write(r, "etc/containerd/config.toml", 'version = "2"\n'),
     ["--runtime", "containerd"], 1, "unknown containerd config version '2'"),
    (lambda r: write(r, "etc/containerd/config.toml", "version = 2\nplugins = 3\n"),
     ["--runtime", "containerd"], 1, "plugins is a int, not a table"),
    (lambda r: write(r, "etc/containerd/config.toml", "version = 2\nplugins = 3\n"),
     ["--runtime", "containerd", "--no-drop-in"], 1, "config.toml: plugins is a int, not a table"),
    (lambda r: write(r, "etc/containerd/config.toml", 'version = 2\n[plugins]\n"io.containerd.grpc.v1.cri" = 3\n'),
     ["--runtime", "containerd"], 1, 'config.toml: plugins."io.containerd.grpc.v1.cri" is a int, not a table'),
    (lambda r: write(r, "etc/containerd/config.toml", 'version = 2\n[plugins]\n"io.containerd.grpc.v1.cri" = 3\n'),
     ["--runtime", "containerd", "--no-drop-in"], 1,
     'config.toml: plugins."io.containerd.grpc.v1.cri" is a int, not a table'),
    (lambda r: write(r, "etc/containerd/config.toml", '[plugins]\ncri = 3\n'),     # version 1: in place
     ["--runtime", "containerd"], 1, "config.toml: plugins.cri is a int, not a table"),
    (lambda r: write(r, "etc/containerd/config.toml", CRI_V2 + "containerd = 3\n"),
     ["--runtime", "containerd", "--no-drop-in"], 1,
     'config.toml: plugins."io.containerd.grpc.v1.cri".containerd is a int, not a table'),
    (lambda r: write(r, "etc/containerd/config.toml", 'version = 2\nimports = "/etc/x.toml"\n'),
     ["--runtime", "containerd"], 1, "imports is not a list of paths"),
    (lambda r: write(r, "etc/containerd/config.toml",
                     'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = 3\n'),
     ["--runtime", "containerd"], 1, "default_runtime_name is a int, not a string"),
    (lambda r: write(r, "etc/containerd/config.toml",
                     'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\nrunc = 1\n'),
     ["--runtime", "containerd"], 1,
     'config.toml: plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc is a int, not a table'),
    # Files containerd reads after hostagent's would replace its CRI section.
    (toolkit_drop_in_after_ours, ["--runtime", "containerd", "--set-as-default"], 1,
     "conf.d/99-nvidia.toml: sets the CRI plugin section and containerd reads it after "
     "/etc/containerd/conf.d/99-hostagent.toml"),
    (toolkit_drop_in_after_ours, ["--runtime", "containerd"], 1,
     "give a --drop-in whose name sorts after 99-nvidia.toml (for example /etc/containerd/conf.d/zz-hostagent.toml)"),
    (nested_import_after_ours, ["--runtime", "containerd"], 1,
     "late.toml: sets the CRI plugin section and containerd reads it after /etc/containerd/conf.d/99-hostagent.toml"),
    (lambda r: write(r, "etc/containerd/site.toml", CRI), ["--runtime", "containerd", "--no-drop-in"], 1,
     "site.toml: sets the CRI plugin section and containerd reads it after /etc/containerd/config.toml"),
    (lambda r: (r / "etc/containerd/site.toml").unlink(), ["--runtime", "containerd"], 1,
     "config.toml: imports /etc/containerd/site.toml, which does not exist"),
    (lambda r: write(r, "etc/containerd/site.toml", 'imports = "/etc/x.toml"\n'), ["--runtime", "containerd"], 1,
     "site.toml: imports is not a list of paths"),
    (lambda r: write(r, "etc/crio/crio.conf", "crio = 3\n"), ["--runtime", "crio"], 1, "crio is a int, not a table"),
    # CRI-O: a drop-in read after hostagent's that sets what it sets.
    (lambda r: shutil.copyfile(INPUTS / "crio-99-nvidia.toml", r / "etc/crio/crio.conf.d/99-nvidia.toml"),
     ["--runtime", "crio", "--set-as-default"], 1,
     "99-nvidia.toml: sets crio.runtime.default_runtime = 'nvidia', and CRI-O reads it after "
     "/etc/crio/crio.conf.d/99-hostagent.toml, so hostagent's 'hostagent' would not take effect (give a --drop-in "
     "whose name sorts after it (for example /etc/crio/crio.conf.d/zz-hostagent.toml)"),
    (lambda r: write(r, "etc/crio/crio.conf.d/99-zz.conf",
                     '[crio.runtime.runtimes.hostagent]\nruntime_path = "/usr/bin/other"\n'),
     ["--runtime", "crio"], 1, "99-zz.conf: sets crio.runtime.runtimes.hostagent.runtime_path = '/usr/bin/other'"),
    (lambda r: write(r, "etc/crio/crio.conf", "[crio.runtime]\nruntimes = []\n"), ["--runtime", "crio"], 1,
     "crio.runtime.runtimes is a list, not a table"),
    (lambda r: shutil.copyfile(INPUTS / "containerd-comments-v1.toml", r / "etc/containerd/config.toml"),
     ["--runtime", "containerd", "--drop-in", "/etc/containerd/conf.d/x.toml"], 2, "version 1 config, which has no imports"),
    (lambda r: shutil.rmtree(r / "etc/containerd"),
     ["--runtime", "containerd"], 1, "etc/containerd: the directory does not exist"),
    (lambda r: None, ["--runtime", "containerd", "--config", "etc/containerd/config.toml"], 2, "must be an absolute path"),
    (lambda r: write(r, "etc/docker/daemon.json", '{"runtimes": {,}}'),
     ["--runtime", "docker"], 1, "daemon.json:1:15: not valid JSON: Expecting property name"),
    (lambda r: write(r, "etc/docker/daemon.json", "[]"), ["--runtime", "docker"], 1, "is not a JSON object"),
    (lambda r: write(r, "etc/docker/daemon.json", '{"runtimes": []}'), ["--runtime", "docker"], 1,
     "runtimes is not a JSON object"),
    (lambda r: None, ["--runtime", "docker", "--drop-in", "/etc/docker/x.json"], 2, "dockerd has no drop-in files"),
    (lambda r: None, ["--runtime", "crio", "--no-drop-in"], 2, "never edits its main file"),
    (lambda r: write(r, "etc/crio/crio.conf.d/10-broken.conf", "[crio.runtime\n"),
     ["--runtime", "crio"], 1, "10-broken.conf:1:14: not valid TOML"),
    (lambda r: (r / "etc/hostagent").mkdir() or write(r, "etc/hostagent/config.yaml", "runtime:\n  cdi_spec_dirs: x\n"),
     ["--runtime", "docker", "--cdi"], 1, "runtime.cdi_spec_dirs: must be of type array, not a string"),
])
def test_bad_input(root, tmp_path, capsys, setup, args, code, message):
    setup(root)
    before = snapshot(root)
    assert configure(root, tmp_path, *args) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert snapshot(root) == before
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("manifest.json"))


def test_bad_input_from_a_real_process_exits_1(root, tmp_path):
    write(root, "etc/containerd/config.toml", "version = [\n")
    proc = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "runtime", "configure",
                           "--runtime", "containerd", "--backup-dir", str(tmp_path / "b")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("hostagent: error: ") and len(proc.stderr.strip().splitlines()) == 1


def test_read_only_drop_in_directory_changes_nothing(root, tmp_path):
    """The drop-in folder is read-only (for root: a read-only tmpfs in a private mount
    namespace, so no other process sees it); the main file must not get its import."""
    folder = root / "etc/containerd/ro"
    folder.mkdir()
    shutil.copyfile(INPUTS / "containerd-default-v2.toml", root / "etc/containerd/config.toml")
    cmd = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), "runtime", "configure",
           "--runtime", "containerd", "--drop-in", "/etc/containerd/ro/99-hostagent.toml",
           "--backup-dir", str(tmp_path / "b")]
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.skip("needs unshare(1) to make a read-only folder as root")
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
               f'mount -t tmpfs -o ro tmpfs "{folder}" && exec "$@"', "sh", *cmd]
    else:
        folder.chmod(0o555)
    before = snapshot(root)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"{folder}: cannot write" in proc.stderr and "nothing was changed" in proc.stderr
    assert snapshot(root) == before
    assert list(folder.iterdir()) == []


def _plan(root):
    host = simulated_host(root)
    return host, plan_configure(host, "containerd", Settings(cdi=True))


def test_concurrent_edit_between_read_and_write_is_refused(root, tmp_path):
    host, plan = _plan(root)
    config = root / "etc/containerd/config.toml"
    admin = config.read_text() + "\n# added by another admin meanwhile\n"

    with pytest.raises(StateError, match="changed while hostagent was editing it"):
        apply_plan(plan, tmp_path / "b" / "containerd", before_rename=lambda: config.write_text(admin))
    assert config.read_text() == admin                           # the admin's edit stands
    assert not (root / "etc/containerd/conf.d/99-hostagent.toml").exists()
    assert not (tmp_path / "b" / "containerd").exists()           # no backup of a run that did nothing
    assert [p.name for p in (root / "etc/containerd").iterdir() if p.name.endswith(".tmp")] == []


def test_same_content_rewritten_meanwhile_is_not_a_conflict(root, tmp_path):
    host, plan = _plan(root)
    config = root / "etc/containerd/config.toml"
    text = config.read_text()
    apply_plan(plan, tmp_path / "b" / "containerd", before_rename=lambda: config.write_text(text))
    assert "99-hostagent.toml" in config.read_text()


def test_file_created_meanwhile_is_refused(root, tmp_path):
    host, plan = _plan(root)
    drop_in = root / "etc/containerd/conf.d/99-hostagent.toml"
    with pytest.raises(StateError):
        apply_plan(plan, tmp_path / "b" / "containerd", before_rename=lambda: drop_in.write_text("# someone else's\n"))
    assert drop_in.read_text() == "# someone else's\n"


def test_race_on_the_second_file_rolls_back_the_first(root, tmp_path, monkeypatch):
    """The drop-in is renamed first; the root file changes right after: both end as before."""
    host, plan = _plan(root)
    config = root / "etc/containerd/config.toml"
    original = config.read_text()
    order = [c.path for c in plan.changes]
    plan.changes.sort(key=lambda c: c.path != "/etc/containerd/conf.d/99-hostagent.toml")
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        real_replace(src, dst)
        calls.append(dst)
        if len(calls) == 1:
            config.write_text(original + "# meanwhile\n")

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(StateError):
        apply_plan(plan, tmp_path / "b" / "containerd")
    monkeypatch.undo()
    assert sorted(order) == sorted(c.path for c in plan.changes)
    assert config.read_text() == original + "# meanwhile\n"
    assert not (root / "etc/containerd/conf.d/99-hostagent.toml").exists()


def test_revert_refuses_a_file_changed_since(root, tmp_path, capsys):
    assert configure(root, tmp_path, "--runtime", "docker") == 0
    daemon = root / "etc/docker/daemon.json"
    daemon.write_text(daemon.read_text().replace("json-file", "journald"))
    changed = daemon.read_text()
    args = ["--simulate", str(root), "runtime", "revert", "--runtime", "docker", "--backup-dir", str(tmp_path / "b")]
    assert main(args) == 1
    assert "changed since hostagent wrote it" in capsys.readouterr().err
    assert daemon.read_text() == changed
    assert main(args + ["--force"]) == 0
    assert daemon.read_text() == (INPUTS / "daemon.json").read_text()


def test_mode_and_owner_of_replaced_files_are_kept(root, tmp_path):
    daemon = root / "etc/docker/daemon.json"
    daemon.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(daemon, 1234, 5678)
    assert configure(root, tmp_path, "--runtime", "docker") == 0
    st = daemon.stat()
    assert st.st_mode & 0o7777 == 0o600 and "hostagent" in daemon.read_text()
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (1234, 5678)
