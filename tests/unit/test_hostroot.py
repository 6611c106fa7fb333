"""HostRoot: symlinks resolve inside the root as the host resolves them, and paths written
for a mounted host's programs are the host's."""

import errno
import os
from pathlib import Path

import pytest

from hostagent.errors import StateError, UsageError
from hostagent.fileio import ensure_dir, write_atomic
from hostagent.hostroot import DRIVER_ROOT_ENV, HOST_ROOT_ENV, SIMULATE_ENV, HostRoot, resolve_within
from hostagent.sim.platform import SIMULATOR, simulated_host, simulator


@pytest.fixture
def debian(tmp_path):
    """A Debian-like root: /var/run -> /run and merged /usr (relative /lib -> usr/lib)."""
    root = tmp_path / "host"
    for d in ("run", "usr/lib", "var", "etc"):
        (root / d).mkdir(parents=True)
    (root / "var/run").symlink_to("/run")
    (root / "lib").symlink_to("usr/lib")
    return root


def test_an_absolute_symlink_resolves_inside_the_root_and_a_write_stays_there(debian):
    host = HostRoot(root=debian)
    assert host.cdi_dir == debian / "run/cdi"               # not this machine's /run/cdi
    assert host.host("/lib/modules") == debian / "usr/lib/modules"
    ensure_dir(host.cdi_dir)
    write_atomic(host.cdi_dir / "nvidia.com-gpu.json", "{}")
    assert (debian / "run/cdi/nvidia.com-gpu.json").read_text() == "{}"


def test_dot_dot_and_link_chains_never_leave_the_root(debian):
    (debian / "etc/up").symlink_to("../../../../../../tmp")
    (debian / "etc/a").symlink_to("/etc/b")
    (debian / "etc/b").symlink_to("../var/run")
    host = HostRoot(root=debian)
    assert host.host("/etc/up/x") == debian / "tmp/x"
    assert host.host("/../../etc/a/nvidia") == debian / "run/nvidia"
    (debian / "etc/loop").symlink_to("/etc/loop")
    with pytest.raises(OSError) as e:
        host.host("/etc/loop/x")
    assert e.value.errno == errno.ELOOP


def test_the_driver_root_is_a_root_of_its_own(debian):
    lib = debian / "run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.550.54.15").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")
    host = HostRoot.mounted_at(debian, "/var/run/nvidia/driver")
    assert host.driver_root == debian / "run/nvidia/driver"
    assert host.resolve(host.driver("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")) == lib / "libnvidia-ml.so.550.54.15"
    assert host.on_host(lib / "libnvidia-ml.so.550.54.15") == \
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"


def test_on_host_removes_a_mounted_root_only(debian, tmp_path):
    mounted = HostRoot.mounted_at(debian)
    assert mounted.on_host(debian / "dev/nvidia0") == "/dev/nvidia0" and mounted.on_host(debian) == "/"
    with pytest.raises(StateError):
        mounted.on_host(tmp_path / "elsewhere")
    # A simulated node's files are on this machine: engines here use its paths as they are.
    assert simulated_host(debian).on_host(debian / "dev/nvidia0") == str(debian / "dev/nvidia0")
    assert HostRoot().on_host("/dev/nvidia0") == "/dev/nvidia0"
    assert HostRoot().host("/var/run/cdi") == Path("/var/run/cdi")   # "/": no resolution at all


def test_options_and_environment(monkeypatch, debian, tmp_path):
    for name in (SIMULATE_ENV, HOST_ROOT_ENV, DRIVER_ROOT_ENV):
        monkeypatch.delenv(name, raising=False)
    assert HostRoot.from_env() == HostRoot()
    monkeypatch.setenv(HOST_ROOT_ENV, str(debian))
    monkeypatch.setenv(DRIVER_ROOT_ENV, "/run/nvidia/driver")
    host = HostRoot.from_env()
    assert host.mounted and not host.simulated and host.driver_root == debian / "run/nvidia/driver"
    both = HostRoot.from_env(simulate=str(debian), simulator=simulator)
    assert both.mounted and both.simulated and both.platform is SIMULATOR
    with pytest.raises(UsageError):
        HostRoot.from_env(simulate=str(tmp_path), simulator=simulator)
    monkeypatch.delenv(HOST_ROOT_ENV)
    # Without a mounted root the driver root is a path on this machine.
    on_this = HostRoot.from_env(simulate=str(debian), driver_root=str(tmp_path), simulator=simulator)
    assert on_this.driver_root == tmp_path and on_this.platform is SIMULATOR
    # Only a program that wires the simulator in (hostagent, hostagentd) runs a simulated node.
    monkeypatch.setenv(SIMULATE_ENV, str(debian))
    with pytest.raises(UsageError, match="cannot run a simulated node"):
        HostRoot.from_env()


def test_resolve_within_keeps_what_does_not_exist(tmp_path):
    assert resolve_within(tmp_path, "/a/b/c") == tmp_path / "a/b/c"
    os.symlink("/a", tmp_path / "x")
    assert resolve_within(tmp_path, "x/new") == tmp_path / "a/new"


def test_a_mounted_hosts_daemons_are_looked_up_in_its_proc(debian):
    from hostagent.driver.probe import PERSISTENCED_PID, _alive
    host = HostRoot.mounted_at(debian)
    pid_file = debian / "run/nvidia-persistenced/nvidia-persistenced.pid"
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{os.getpid()}\n")        # a pid of this machine's, not of the host's /proc
    assert _alive(host, PERSISTENCED_PID) is None
    (debian / f"proc/{os.getpid()}").mkdir(parents=True)
    stat_file = debian / f"proc/{os.getpid()}/stat"
    stat_file.write_text(f"{os.getpid()} (nvidia-persiste) S 1 1 1 0\n")
    assert _alive(host, PERSISTENCED_PID) == os.getpid()
    stat_file.write_text(f"{os.getpid()} (nvidia-persiste) Z 1 1 1 0\n")
    assert _alive(host, PERSISTENCED_PID) is None


def test_a_mounted_hosts_driver_programs_run_in_its_root(debian, tmp_path):
    smi = debian / "run/nvidia/driver/usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("")
    assert HostRoot.mounted_at(debian, "/run/nvidia/driver").driver_command("nvidia-smi") == \
        ["chroot", str(debian / "run/nvidia/driver"), "/usr/bin/nvidia-smi"]
    assert HostRoot.mounted_at(debian).driver_command("nvidia-smi") is None
    # A simulated node's stand-ins run on this machine, mounted or not.
    assert HostRoot.mounted_at(debian, "/run/nvidia/driver", platform=SIMULATOR).driver_command("nvidia-smi") == [str(smi)]
    assert HostRoot(root=debian, driver_root=debian / "run/nvidia/driver").driver_command("nvidia-smi") == [str(smi)]


def test_a_mounted_hosts_group_is_the_hosts(debian):
    import grp
    from hostagent.daemon.listen import group_id
    mine = grp.getgrgid(os.getgid()).gr_name           # a group of this machine's
    (debian / "etc/group").write_text("hostagent:x:4321:alice,bob\n")
    host = HostRoot.mounted_at(debian)
    assert group_id("hostagent", host) == 4321
    assert group_id(mine, host) is None and group_id(mine) == os.getgid()


def test_the_groups_name_is_the_mounted_hosts(tmp_path, monkeypatch):
    """In the agent's container a gid means what the host's /etc/group says, not the image's."""
    from hostagent.groups import group_name
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/group").write_text("root:x:0:\nhostagent:x:64999:alice\n")
    host = HostRoot.mounted_at(tmp_path)
    assert group_name(64999, host) == "hostagent" and group_name(0, host) == "root"
    assert group_name(12345, host) is None
    monkeypatch.setenv("HOSTAGENT_HOST_ROOT", str(tmp_path))
    assert group_name(64999) == "hostagent"          # a command in the container, given no HostRoot
