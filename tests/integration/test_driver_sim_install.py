"""The driver installer from end to end on a simulated node: the node carries a distribution
(``sim create --distro``) whose package tools are the simulator's, so ``driver plan``,
``install`` and ``rollback`` run as on a host of that distribution, without one."""

import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "hostagent.cli.main"]


def hostagent(*args):
    done = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def node(tmp_path, distro=None, profile="a30x4"):
    root = tmp_path / "node"
    assert hostagent("sim", "create", "--profile", profile, "--root", root,
                     *(["--distro", distro] if distro else [])).returncode == 0
    return root


def driver_version(root) -> str:
    out = hostagent("--simulate", root, "node").stdout
    return next(line.split()[-1] for line in out.splitlines() if line.startswith("driver version"))


@pytest.mark.parametrize("distro, packages", [
    ("debian-12", ["nvidia-driver=550.127.05-1", "linux-headers-6.1.0-28-amd64=6.1.119-1"]),
    ("ubuntu-22.04", ["nvidia-driver-550-server=550.127.05-0ubuntu0.22.04.1",
                      "linux-modules-nvidia-550-server-6.1.0-28-amd64=550.127.05-0ubuntu0.22.04.1"]),
    ("rocky-9", ["nvidia-driver=3:550.127.05-1.el9", "kmod-nvidia-latest-dkms=3:550.127.05-1.el9"]),
])
def test_install_and_roll_back_on_each_distribution(tmp_path, distro, packages):
    root = node(tmp_path, distro)
    assert driver_version(root) == "550.90.07"
    plan = hostagent("--simulate", root, "driver", "plan", "--version", "550.127.05")
    assert plan.returncode == 0 and all(p in plan.stdout.splitlines()[1] for p in packages), plan.stdout
    done = hostagent("--simulate", root, "driver", "install", "--version", "550.127.05")
    assert done.returncode == 0 and done.stdout == "driver 550.127.05 installed and verified\n", done.stderr
    assert driver_version(root) == "550.127.05"
    back = hostagent("--simulate", root, "driver", "rollback")
    assert back.returncode == 0 and back.stdout == "driver 550.90.07 restored and verified\n", back.stderr
    assert driver_version(root) == "550.90.07"


def test_a_node_carries_debian_12_by_default(tmp_path):
    root = node(tmp_path)
    assert 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"' in (root / "etc/os-release").read_text()
    assert hostagent("--simulate", root, "driver", "plan", "--version", "550.127.05").returncode == 0


def test_debian_without_non_free_says_where_the_driver_is(tmp_path):
    root = node(tmp_path, "debian-12")
    (root / "etc/apt/sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n")
    done = hostagent("--simulate", root, "driver", "plan", "--version", "550.127.05")
    assert done.returncode == 1 and done.stderr == (
        "hostagent: error: no repository offers nvidia-driver 550.127.05 (offered: none), nor NVIDIA's repository "
        "cuda-drivers 550.127.05 (Debian ships the driver in its non-free component and the GSP firmware in "
        "non-free-firmware: add both to the sources (deb http://deb.debian.org/debian bookworm main contrib "
        "non-free non-free-firmware), then apt-get update and retry)\n")


def test_an_unknown_distribution_is_a_usage_error_and_builds_nothing(tmp_path):
    done = hostagent("sim", "create", "--root", tmp_path / "n", "--distro", "debain-12")
    assert done.returncode == 2 and "unknown distribution 'debain-12' (did you mean 'debian-12'?)" in done.stderr
    assert not (tmp_path / "n").exists()


def test_the_mismatch_fault_moves_the_packages_too(tmp_path):
    root = node(tmp_path, "debian-12")
    assert hostagent("sim", "fault", "mismatch", "--version", "550.127.05", "--root", root).returncode == 0
    listed = subprocess.run([root / "usr/bin/dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "nvidia-driver"],
                            capture_output=True, text=True).stdout
    assert listed == "nvidia-driver 550.127.05-1\n"
