"""The deb on a clean Debian 12 booted with systemd: installed by apt, serving a simulated
node through a drop-in, reloaded, used as root and as a normal user, removed, purged.

One booted container for the module; the tests run in file order on it (the last two
remove and purge the package).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from hostagent.cli.main import COMMANDS
from hostagent.config import schema

from .. import debian_root

SRC = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.root("the deb is installed in a booted Debian container (podman, systemd) run as root"),
              pytest.mark.engine]

SIM = "/srv/hostagent-sim"
DROP_IN = f"[Service]\nEnvironment=HOSTAGENT_SIMULATE={SIM}\nReadWritePaths={SIM}\n"
ADMIN_CONTAINERD = "# the admin's own containerd configuration\nversion = 2\n"
# Where a test run changes files that are not the package's: apt's and dpkg's own records,
# logs, the journal, systemd's runtime state.
UNLISTED = ("/proc", "/sys", "/dev", "/tmp", "/var/tmp", "/var/log", "/var/cache", "/var/lib/apt",
            "/var/lib/dpkg", "/run/systemd", "/run/user", "/run/dbus", "/run/lock", "/var/lib/systemd/timers",
            "/var/lib/systemd/catalog", "/run/mount")


def listing(box) -> set[str]:
    prune = " -o ".join(f"-path {p}" for p in UNLISTED)
    out = box.sh(f"find / /run -xdev \\( {prune} \\) -prune -o -print").stdout
    return set(out.split("\n")) - {""}


def processes(box, word: str) -> list[str]:
    """Command lines that contain ``word`` ([x]yz: not the grep's own shell)."""
    out = box.sh(f"grep -l '[{word[0]}]{word[1:]}' /proc/[0-9]*/cmdline 2>/dev/null || true").stdout
    return out.split()


def test_deb_names_no_build_folder_and_documents_every_program(deb_package, staged_tree, tmp_path):
    tree = tmp_path / "tree"
    subprocess.run(["dpkg-deb", "-x", str(deb_package), str(tree)], check=True)
    folders = [str(f).encode() for f in (deb_package.parent / "work", staged_tree.parent)]
    assert not [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()
                and any(f in p.read_bytes() for f in folders)]
    with open(SRC / "pyproject.toml", "rb") as f:
        programs = tomllib.load(f)["project"]["scripts"]
    for name in programs:
        assert (tree / "usr/bin" / name).readlink() == Path("/opt/hostagent/bin") / name
        assert (tree / "opt/hostagent/bin" / name).read_text().startswith("#!/opt/hostagent/bin/python -I\n")
        [page] = tree.glob(f"usr/share/man/man[18]/{name}.[18].gz")
        text = gzip.decompress(page.read_bytes()).decode()
        # A NAME line whatis and apropos read ("name \- what it is"), and the exit codes.
        assert re.search(rf"^\.SH NAME\n{re.escape(name.replace('-', chr(92) + '-'))} \\- \w", text, re.M), name
        assert "\n.SH EXIT STATUS\n" in text, name
        if shutil.which("lexgrog"):
            whatis = subprocess.run(["lexgrog", str(page)], capture_output=True, text=True)
            assert whatis.returncode == 0 and f'"{name} - ' in whatis.stdout, whatis.stdout
    completion = (tree / "usr/share/bash-completion/completions/hostagent").read_text()
    assert all(re.search(rf"\b{command}\b", completion) for command in COMMANDS)
    # Units run the packaged programs.
    for unit in (tree / "lib/systemd/system").iterdir():
        for program in re.findall(r"^Exec\w*=[-+@!]*(/\S+)", unit.read_text(), re.M):
            if program.startswith("/usr/bin/hostagent"):
                assert (tree / program.lstrip("/")).is_symlink(), f"{unit.name}: {program}"
    # The configuration file: every section of the schema, nothing set.
    config = (tree / "etc/hostagent/config.yaml").read_text()
    assert yaml.safe_load(config) is None
    assert all(f"# {section}:" in config for section in schema()["properties"])


@pytest.fixture(scope="module")
def box(debian_image, deb_package):
    with debian_root.booted(debian_image) as box:
        # A normal user and an admin's containerd file exist before hostagent does.
        box.sh("useradd -m tester && mkdir -p /etc/containerd")
        box.run("sh", "-c", "cat > /etc/containerd/config.toml", input=ADMIN_CONTAINERD)
        box.before = listing(box)
        box.copy_in(deb_package, "/root/")
        box.install = box.run("apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb_package.name}",
                              timeout=300)
        yield box


def test_apt_installs_it_and_starts_the_service_on_a_node_without_a_gpu(box, deb_package):
    version = deb_package.name.split("_")[1].rsplit("-", 1)[0]
    for program in ("hostagent", "hostagentd"):
        assert box.run(program, "--version").stdout.strip() == f"{program} {version}"
    for path in ("/usr/bin/hostagent-hook", "/usr/bin/hostagent-runtime", "/etc/hostagent/config.yaml",
                 "/lib/systemd/system/hostagent.service", "/usr/share/doc/hostagent/daemon.md",
                 "/usr/share/man/man1/hostagent.1.gz", "/usr/share/man/man8/hostagentd.8.gz",
                 "/usr/share/bash-completion/completions/hostagent",
                 "/usr/share/doc/hostagent/hostagent-dashboard.json"):      # as the rpm ships it
        box.run("test", "-e", path)
    assert "/etc/hostagent/config.yaml" in box.run("cat", "/var/lib/dpkg/info/hostagent.conffiles").stdout
    # The hook's program runs isolated from PATH (it refuses otherwise).
    assert "usage: hostagent-hook" in box.run("hostagent-hook", "--help").stdout
    box.run("getent", "group", "hostagent")
    # No GPU: the service is up and says why it has no inventory.
    box.wait_until("systemctl is-active hostagent")
    status = box.run("systemctl", "show", "-p", "StatusText", "hostagent").stdout
    assert "libnvidia-ml.so.1 could not be loaded" in status
    assert box.run("hostagentd", "--check").returncode == 0
    # The boot-time MIG unit is enabled, not run: it needs /etc/hostagent/mig.env. The device
    # plugin is enabled and waits for a kubelet (none here) instead of failing.
    for unit in ("hostagent-mig", "hostagent-device-plugin"):
        assert box.run("systemctl", "is-enabled", unit).stdout.strip() == "enabled"
        assert box.run("systemctl", "is-active", unit, check=False).stdout.strip() == "inactive"


def test_the_daemon_judges_secure_boot_without_the_kernel_log_its_sandbox_hides(box):
    """The unit's ProtectKernelLogs= closes /dev/kmsg to the daemon (its kernel-log row says
    so and why); root's shell reads the log. The secure-boot row does not depend on it."""
    ask = ("import json; from hostagent.client import Client; "
           "print(json.dumps({c['name']: c for c in Client().driver()['checks']}))")
    daemon = json.loads(box.run("/opt/hostagent/bin/python", "-I", "-c", ask).stdout)
    log = daemon["kernel-log"]
    assert log["result"] == "skipped" and "/dev/kmsg is closed to this process" in log["summary"]
    assert "ProtectKernelLogs" in log["summary"]
    assert daemon["secure-boot"]["result"] != "fail"
    shell = json.loads(box.run("hostagent", "driver", "verify", "-o", "json", check=False).stdout)
    assert {c["name"]: c["result"] for c in shell["checks"]}["kernel-log"] in ("ok", "warn")


def test_the_service_serves_a_simulated_node_through_a_drop_in_and_reloads(box):
    box.run("hostagent", "sim", "create", "--profile", "a30x4", "--root", SIM)
    box.sh(f"mkdir -p /etc/systemd/system/hostagent.service.d && printf '{DROP_IN}' "
           "> /etc/systemd/system/hostagent.service.d/simulate.conf && systemctl daemon-reload "
           "&& systemctl restart hostagent")
    box.wait_until("systemctl is-active hostagent")
    node = json.loads(box.run("hostagent", "--simulate", SIM, "node", "-o", "json").stdout)
    check = box.run("hostagentd", "--check", "--simulate", SIM).stdout
    assert f"{SIM}/run/hostagent/hostagent.sock" in check and node
    status = box.run("systemctl", "show", "-p", "StatusText", "-p", "MainPID", "hostagent").stdout
    assert "serving 4 GPU(s)" in status
    pid = status.split("MainPID=")[1].split()[0]

    box.run("systemctl", "reload", "hostagent")
    box.wait_until("journalctl -u hostagent | grep -q 'configuration reloaded'")
    after = box.run("systemctl", "show", "-p", "MainPID", "-p", "ActiveState", "hostagent").stdout
    assert f"MainPID={pid}" in after and "ActiveState=active" in after


def test_devices_as_root_and_as_a_normal_user(box):
    as_root = json.loads(box.run("hostagent", "--simulate", SIM, "devices", "-o", "json").stdout)
    as_user = json.loads(box.run("hostagent", "--simulate", SIM, "devices", "-o", "json", user="tester").stdout)
    uuids = lambda inv: [g["uuid"] for g in inv["gpus"]]  # noqa: E731
    assert len(uuids(as_root)) == 4 and uuids(as_user) == uuids(as_root)
    # The API socket is for root and the hostagent group: a normal user gets a clear refusal.
    refused = box.run("hostagentd", "--check", "--simulate", SIM, user="tester", check=False)
    assert refused.returncode == 1 and "not answering" in refused.stderr


def test_boot_time_mig_unit_applies_a_layout_inside_its_sandbox(box):
    box.sh(f"mkdir -p /etc/systemd/system/hostagent-mig.service.d && printf '{DROP_IN}' "
           "> /etc/systemd/system/hostagent-mig.service.d/simulate.conf && systemctl daemon-reload")
    box.sh("echo MIG_PARTED_SELECTED_CONFIG=all-1g.6gb > /etc/hostagent/mig.env")
    box.run("systemctl", "start", "hostagent-mig", timeout=300)
    assert box.run("systemctl", "is-active", "hostagent-mig").stdout.strip() == "active"
    gpus = json.loads(box.run("hostagent", "--simulate", SIM, "devices", "-o", "json").stdout)["gpus"]
    assert [len(g["mig"]["gpu_instances"]) for g in gpus] == [4, 4, 4, 4]


def test_remove_stops_the_service_keeps_config_and_restores_the_runtime_config(box):
    box.run("hostagent", "runtime", "configure", "--runtime", "containerd")
    assert "99-hostagent.toml" in box.run("cat", "/etc/containerd/config.toml").stdout
    box.run("apt-get", "remove", "-y", "hostagent", timeout=300)
    assert processes(box, "hostagentd") == []
    box.run("test", "-f", "/etc/hostagent/config.yaml")
    assert box.run("cat", "/etc/containerd/config.toml").stdout == ADMIN_CONTAINERD
    box.run("test", "!", "-e", "/etc/containerd/conf.d/99-hostagent.toml")
    box.run("test", "!", "-e", "/opt/hostagent")


def test_purge_leaves_nothing(box, deb_package):
    # What the agent writes on a node: the node's CDI spec and labels (made here by the
    # commands the daemon's work is made of, since the simulated daemon writes under SIM).
    box.run("apt-get", "install", "-y", f"/root/{deb_package.name}", timeout=300)
    box.sh(f"mkdir -p /var/run/cdi && hostagent --simulate {SIM} cdi generate > /var/run/cdi/nvidia.com-gpu.json")
    (hook,) = json.loads(box.run("cat", "/var/run/cdi/nvidia.com-gpu.json").stdout)["containerEdits"]["hooks"]
    assert hook["path"] == hook["args"][0] == "/opt/hostagent/bin/python"     # the package's own interpreter
    box.sh(f"hostagent --simulate {SIM} labels > /etc/kubernetes/node-feature-discovery/features.d/hostagent")
    box.wait_until("test -S /run/hostagent/hostagent.sock || test -S " + f"{SIM}/run/hostagent/hostagent.sock")
    # The test's own files go first: the simulated node and the drop-ins.
    box.sh(f"rm -rf {SIM} /etc/systemd/system/hostagent.service.d /etc/systemd/system/hostagent-mig.service.d "
           "/root/*.deb")
    # The GPU operator's folder: a driver-ready marker hostagent wrote (as its daemon writes
    # it; a killed daemon leaves it) beside the operator's own files.
    operator = "/run/nvidia/validations"
    box.sh(f"mkdir -p {operator} && touch {operator}/toolkit-ready && echo 'GDS_ENABLED: false' "
           f"> {operator}/.driver-ctr-ready && echo IS_HOST_DRIVER=true > {operator}/cuda-ready")
    box.run("/opt/hostagent/bin/python", "-I", "-c", "from hostagent.driver.markers import Markers; "
            "from hostagent.hostroot import HostRoot; "
            f"assert Markers(HostRoot(), '{operator}').ready()")
    # MPS clients' shared /dev/shm, still mounted with a client's file in it (sharing that
    # could not be stopped): detached, not emptied, and the purge goes through.
    box.sh("mkdir -p /run/hostagent/mps/shm && mount -t tmpfs shm /run/hostagent/mps/shm && "
           "echo client > /run/hostagent/mps/shm/cuda.shm.0")
    box.run("apt-get", "purge", "-y", "hostagent", timeout=300)
    assert processes(box, "hostagentd") == []
    assert "/run/hostagent" not in box.run("cat", "/proc/mounts").stdout
    # Its marker went, the operator's files stayed (then the test's own go).
    assert box.sh(f"ls -A {operator}").stdout.split() == [".driver-ctr-ready", "cuda-ready", "toolkit-ready"]
    box.sh("rm -rf /run/nvidia")
    assert box.run("getent", "group", "hostagent", check=False).returncode == 2
    assert box.run("cat", "/etc/containerd/config.toml").stdout == ADMIN_CONTAINERD
    after = listing(box)
    assert sorted(after - box.before) == []
    # dpkg removes the empty /opt no package owns, as for every package installed under it.
    assert sorted(box.before - after) in ([], ["/opt"])
