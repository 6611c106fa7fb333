"""configure on containerd configs with imports, checked by containerd itself.

`containerd --config FILE config dump` prints the configuration containerd would run with
(the root file merged with its imports, over the defaults). Before and after configure it
must be the same apart from hostagent's runtime (and what the flags ask for). containerd
1.6 knows the version 2 CRI section only (its dump has no version 3 section to compare).
Real paths in a temporary directory, no --simulate: containerd resolves the imports (and
the node lock is taken in a temporary run folder, not the host's).
"""

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from hostagent.cli.main import main

INPUTS = Path(__file__).parent / "golden" / "runtime" / "inputs"
CRI = "io.containerd.grpc.v1.cri"
SHIM = "/usr/local/sbin/hostagent-runtime"

pytestmark = [pytest.mark.skipif(not shutil.which("containerd"), reason="containerd is not installed"),
              pytest.mark.usefixtures("private_run_dir")]


def dump(config: Path) -> dict:
    proc = subprocess.run(["containerd", "--config", str(config), "config", "dump"],
                          capture_output=True, text=True, timeout=60, cwd=config.parent)
    assert proc.returncode == 0, proc.stderr
    return tomllib.loads(proc.stdout)


def configure(d: Path, *args) -> int:
    return main(["runtime", "configure", "--runtime", "containerd", "--config", str(d / "config.toml"),
                 "--backup-dir", str(d / "backups"), *args])


def without(data: dict, *paths) -> dict:
    """``data`` with the keys at ``paths`` (tuples of keys) removed."""
    import copy
    data = copy.deepcopy(data)
    for path in paths:
        node = data
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
    return data


def site_config(d: Path) -> None:
    """A root file with a CRI section, and a site drop-in that (before containerd 2.1)
    replaces it: 7 downloads at once, a registry config_path, SystemdCgroup for runc."""
    (d / "site.d").mkdir()
    text = (INPUTS / "containerd-site-dropins-v2.toml").read_text().replace("/etc/containerd", str(d))
    (d / "config.toml").write_text(text)
    shutil.copyfile(INPUTS / "containerd-50-site-v2.toml", d / "site.d/50-site.toml")


def test_site_drop_in_settings_survive(tmp_path):
    site_config(tmp_path)
    before = dump(tmp_path / "config.toml")
    assert before["plugins"][CRI]["max_concurrent_downloads"] == 7           # the site's section is in force
    assert configure(tmp_path) == 0
    assert (tmp_path / "conf.d/99-hostagent.toml").exists()                   # beside --config
    after = dump(tmp_path / "config.toml")
    cri = after["plugins"][CRI]
    runtime = cri["containerd"]["runtimes"]["hostagent"]
    assert runtime["options"]["BinaryName"] == SHIM and runtime["options"]["SystemdCgroup"] is True
    assert cri["max_concurrent_downloads"] == 7
    assert cri["registry"]["config_path"] == "/etc/containerd/certs.d"
    assert cri["sandbox_image"] == "registry.example.com/pause:3.9"
    assert cri["containerd"]["default_runtime_name"] == "runc"
    added = ("plugins", CRI, "containerd", "runtimes", "hostagent")
    assert without(after, added, ("imports",)) == without(before, ("imports",))


def test_toolkit_drop_in_read_later_is_refused_and_a_later_name_works(tmp_path, capsys):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "config.toml").write_text(f'version = 2\nimports = ["{tmp_path}/conf.d/*.toml"]\n')
    shutil.copyfile(INPUTS / "containerd-99-nvidia-v2.toml", tmp_path / "conf.d/99-nvidia.toml")
    before = dump(tmp_path / "config.toml")
    assert before["plugins"][CRI]["containerd"]["default_runtime_name"] == "nvidia"
    files = sorted(p.name for p in tmp_path.rglob("*"))

    assert configure(tmp_path, "--set-as-default") == 1                      # 99-nvidia sorts after 99-hostagent
    assert "99-nvidia.toml: sets the CRI plugin section" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == files

    assert configure(tmp_path, "--set-as-default", "--drop-in", str(tmp_path / "conf.d/zz-hostagent.toml")) == 0
    after = dump(tmp_path / "config.toml")
    containerd = after["plugins"][CRI]["containerd"]
    assert containerd["default_runtime_name"] == "hostagent"
    assert containerd["runtimes"]["hostagent"]["options"]["BinaryName"] == SHIM
    assert containerd["runtimes"]["hostagent"]["options"]["SystemdCgroup"] is True      # from runc, not nvidia
    assert containerd["runtimes"]["nvidia"] == before["plugins"][CRI]["containerd"]["runtimes"]["nvidia"]
    added = ("plugins", CRI, "containerd", "runtimes", "hostagent")
    default = ("plugins", CRI, "containerd", "default_runtime_name")
    assert without(after, added, default, ("imports",)) == without(before, default, ("imports",))


def test_revert_gives_containerd_its_old_configuration(tmp_path):
    site_config(tmp_path)
    before = dump(tmp_path / "config.toml")
    assert configure(tmp_path, "--cdi") == 0
    assert configure(tmp_path, "--set-as-default") == 0
    assert main(["runtime", "revert", "--runtime", "containerd", "--backup-dir", str(tmp_path / "backups")]) == 0
    after = dump(tmp_path / "config.toml")
    # The loaded files, in the dump in no fixed order (containerd lists them from a map).
    assert sorted(after.pop("imports")) == sorted(before.pop("imports"))
    assert after == before
    assert not (tmp_path / "conf.d").exists()
