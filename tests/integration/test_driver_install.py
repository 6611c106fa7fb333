"""``driver plan``, ``install`` and ``rollback`` with Debian's real apt and dpkg, in a clean
Debian 12 root (mmdebstrap) that also holds a simulated HGX H100 node, against a local
repository of stand-in driver packages. The packages install what the node reads, so the
installer's module load and ``driver verify`` see the version apt installed."""

import json
import os
import subprocess
import sys

import pytest

from hostagent.sim import control
from hostagent.sim.driverroot import create_node
from hostagent.sim.store import SimStore
from tests.waiting import until

from ..debian_root import chroot, extract, overlay, root_tarball
from .driver_packages import build_repo, package_version

A, B, BROKEN = "550.90.07", "550.127.05", "550.135"       # A: the node's driver at creation
DRIVER_PACKAGES = ("firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-driver", "nvidia-kernel-dkms")

pytestmark = pytest.mark.root("apt and dpkg run chrooted in a Debian root, and chroot needs root")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    if subprocess.run(["which", "dpkg-scanpackages"], capture_output=True).returncode:
        pytest.skip("dpkg-scanpackages is missing (apt-get install dpkg-dev)")
    return build_repo(tmp_path_factory.mktemp("repo") / "repo", {A: False, B: False, BROKEN: True})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, repo):
    """A Debian root with the node's driver A installed from the repository (so its files
    belong to packages, as on a host installed with apt), built at the path each test's
    copy is mounted at, and kept aside as the copies' base."""
    base = tmp_path_factory.mktemp("debian")
    root = extract(root_tarball(()), base / "root")     # minbase: apt and dpkg are all it needs
    create_node(root, "hgx-h100")
    subprocess.run(["cp", "-r", str(repo), str(root / "srv/repo")], check=True)
    (root / "etc/apt/sources.list").write_text("deb [trusted=yes] file:/srv/repo ./\n")
    for extra in (root / "etc/apt/sources.list.d").glob("*"):
        extra.unlink()
    # Debian's /var/run and /var/lock point at /run by absolute links: inside a root used
    # from outside (not chrooted) they would lead to this machine's /run.
    for link, target in (("var/run", "../run"), ("var/lock", "../run/lock")):
        (root / link).unlink()
        (root / link).symlink_to(target)
    chroot(root, "apt-get", "update", "-q")
    chroot(root, "apt-get", "install", "-y", "-q", *(f"{p}={package_version(A)}" for p in DRIVER_PACKAGES))
    root.rename(base / "pristine")
    return base


@pytest.fixture
def root(tmp_path, prepared):
    with overlay(prepared / "pristine", tmp_path, prepared / "root") as copy:
        yield copy


def hostagent(root, *args, env=None):
    proc = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root), *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def installed(root) -> dict:
    out = chroot(root, "dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *DRIVER_PACKAGES).stdout
    return dict(line.split() for line in out.splitlines())


def held(root) -> set:
    return set(chroot(root, "apt-mark", "showhold").stdout.split())


def loaded(root) -> str:
    return (root / "sys/module/nvidia/version").read_text().strip()


def test_plan_lists_packages_and_steps_and_changes_nothing(root):
    before = installed(root)
    proc = hostagent(root, "driver", "plan", "--version", B, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["distro"] == "Debian GNU/Linux 12 (bookworm)" and plan["manager"] == "apt"
    assert plan["previous"] == A and plan["flavour"] == "proprietary"
    assert sorted(plan["packages"]) == sorted([p, package_version(B)] for p in DRIVER_PACKAGES)
    assert [s["name"] for s in plan["steps"]] == [
        "maintenance", "check-users", "unload-modules", "install", "hold", "load-modules", "create-nodes",
        "verify", "resume"]
    install = next(s for s in plan["steps"] if s["name"] == "install")["commands"][0]
    assert install[:2] == ["apt-get", "install"] and f"nvidia-driver={package_version(B)}" in install
    table = hostagent(root, "driver", "install", "--version", B, "--dry-run").stdout
    assert f"driver install on Debian GNU/Linux 12 (bookworm) with apt: {A} -> {B}" in table
    assert "$ modprobe -r nvidia_uvm nvidia_modeset nvidia" not in table     # unload order
    assert "$ modprobe -r nvidia_modeset nvidia_uvm nvidia" in table
    assert installed(root) == before and loaded(root) == A


def test_bad_input_is_one_line_and_changes_nothing(root):
    before = installed(root)
    cases = [(("--version", "latest"), 2, "'latest' is not an NVIDIA driver version"),
             (("--version", "999.1.1"), 1, "no repository offers nvidia-driver 999.1.1 (offered: "
                                           f"{package_version(BROKEN)}, {package_version(B)}, {package_version(A)}), nor NVIDIA's "
                                           "repository nvidia-open 999.1.1")]
    for args, code, text in cases:
        proc = hostagent(root, "driver", "install", *args)
        assert proc.returncode == code and text in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    chroot(root, "apt-mark", "hold", "libcuda1")                 # an admin's pin
    proc = hostagent(root, "driver", "install", "--version", B)
    assert proc.returncode == 1 and "held package(s) libcuda1" in proc.stderr
    assert "apt-mark unhold libcuda1" in proc.stderr
    (root / "etc/os-release").unlink()
    (root / "usr/lib/os-release").write_text('ID=alpine\nVERSION_ID=3.20\nPRETTY_NAME="Alpine Linux v3.20"\n')
    proc = hostagent(root, "driver", "install", "--version", B)
    assert proc.returncode == 1 and "does not support Alpine Linux v3.20" in proc.stderr
    assert installed(root) == before and loaded(root) == A
    assert not (root / "var/lib/hostagent/driver/journal.json").exists()


def test_install_upgrades_holds_reloads_verifies_and_keeps_the_daemons(root):
    store = SimStore(root)
    persistenced = subprocess.run([str(root / "usr/bin/nvidia-persistenced")], capture_output=True)
    assert persistenced.returncode == 0
    pid_file = root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    old_pid = int(pid_file.read_text())
    proc = hostagent(root, "driver", "install", "--version", B)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"driver {B} installed and verified"
    for step in ("stop-services", "unload-modules", "install", "hold", "load-modules", "verify"):
        assert f"hostagent: {step}:" in proc.stderr
    assert installed(root) == {p: package_version(B) for p in DRIVER_PACKAGES}
    assert held(root) == set(DRIVER_PACKAGES)
    assert loaded(root) == B and control.__name__           # the module apt installed came up
    new_pid = int(pid_file.read_text())
    assert new_pid != old_pid and os.path.exists(f"/proc/{new_pid}")    # stopped, then started again
    verify = json.loads(hostagent(root, "driver", "verify", "-o", "json").stdout)
    assert verify["usable"] and verify["driver_version"] == B
    history = json.loads((root / "var/lib/hostagent/driver/history.json").read_text())
    assert history["driver_version"] == B and history["previous_version"] == A
    assert not (root / "var/lib/hostagent/driver/journal.json").exists()
    os.kill(new_pid, 15)
    # Back to A: the holds this install placed are released first, then placed on A.
    back = hostagent(root, "driver", "rollback")
    assert back.returncode == 0, back.stderr
    assert installed(root) == {p: package_version(A) for p in DRIVER_PACKAGES} and loaded(root) == A
    assert held(root) == set(DRIVER_PACKAGES)
    assert store.read().driver_loaded


def test_a_version_that_does_not_verify_is_rolled_back(root):
    proc = hostagent(root, "driver", "install", "--version", BROKEN)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"driver {BROKEN} did not work (the driver {BROKEN} does not verify: "
                                  "gsp-firmware: no GSP firmware")
    assert f"rolled back to {A}, which verifies" in proc.stdout
    assert installed(root) == {p: package_version(A) for p in DRIVER_PACKAGES}
    assert loaded(root) == A and held(root) == set(DRIVER_PACKAGES)
    assert not (root / "var/lib/hostagent/driver/journal.json").exists()


def test_a_killed_install_is_reported_then_resumed(root):
    proc = hostagent(root, "driver", "install", "--version", B, env={"HOSTAGENT_FAULT": "driver:after_install"})
    assert proc.returncode == -9
    journal = json.loads((root / "var/lib/hostagent/driver/journal.json").read_text())
    assert journal["done"][-1] == "install" and journal["status"] == "running"
    assert not (root / "sys/module/nvidia").exists()            # unloaded, not yet loaded again
    note = hostagent(root, "driver", "plan", "--version", B)
    assert f"the driver install of {B}" in note.stderr and "was interrupted" in note.stderr
    other = hostagent(root, "driver", "install", "--version", BROKEN)
    assert other.returncode == 1 and "finish it" in other.stderr
    resumed = hostagent(root, "driver", "install", "--version", B)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming the driver install of {B}" in resumed.stderr
    assert "hostagent: unload-modules:" not in resumed.stderr          # done before the kill
    assert loaded(root) == B and installed(root)["nvidia-driver"] == package_version(B)


def test_with_the_daemon_running_the_install_holds_its_gpu_work(root):
    from .agentd import AgentProcess
    agent = AgentProcess(root, {"daemon": {"resync_interval": 0}, "driver": {"interval": 0}}).start()
    try:
        with agent.client() as c:
            assert c.driver()["version"] == A
            c.allocate("job", ["0"])
            refused = hostagent(root, "driver", "install", "--version", B)
            assert refused.returncode == 1 and "1 user(s) of the GPUs remain: allocation job" in refused.stdout
            assert "--force" in refused.stdout and installed(root)["nvidia-driver"] == package_version(A)
            assert c.driver()["state"] == "ready"                  # maintenance ended with the refusal
            proc = hostagent(root, "driver", "install", "--version", B, "--force")
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert "going on although allocation job uses a GPU (--force)" in proc.stderr
            driver = c.driver()
            assert driver["state"] == "ready" and driver["version"] == B and driver["maintenance"] is None
        log = agent.log()
        assert f"driver maintenance: driver install {B} (pid" in log and "driver maintenance over" in log
    finally:
        agent.stop()


def test_a_daemon_run_by_systemd_is_restarted_once_the_driver_changed(root):
    """It keeps the NVML library it loaded: the plan's last step restarts its unit. systemd is
    a stand-in here that says hostagent.service is active and records what it is asked."""
    from .agentd import AgentProcess
    (root / "run/systemd/system").mkdir(parents=True, exist_ok=True)
    systemctl = root / "usr/bin/systemctl"
    systemctl.write_text('#!/bin/sh\necho "$*" >> /systemctl.calls\ncase "$*" in\n'
                         '  "is-active --quiet hostagent.service") exit 0 ;;\n  is-active*) exit 3 ;;\nesac\n')
    systemctl.chmod(0o755)
    agent = AgentProcess(root, {"daemon": {"resync_interval": 0}, "driver": {"interval": 0}}).start()
    try:
        plan = json.loads(hostagent(root, "driver", "plan", "--version", B, "-o", "json").stdout)
        assert plan["steps"][-1] == {"name": "restart-agent", "title": plan["steps"][-1]["title"],
                                     "commands": [["systemctl", "try-restart", "hostagent.service"]]}
        assert "$ systemctl try-restart hostagent.service" in hostagent(root, "driver", "install", "--version", B,
                                                                        "--dry-run").stdout
        proc = hostagent(root, "driver", "install", "--version", B)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "hostagent: restart-agent:" in proc.stderr and loaded(root) == B
        assert "try-restart hostagent.service" in (root / "systemctl.calls").read_text().splitlines()
        # Nothing restarted the daemon here: whose installer is gone, it leaves maintenance itself.
        with agent.client() as c:
            until(lambda: c.driver()["state"] == "ready", 30, c.driver, interval=0.2)
    finally:
        agent.stop()
