"""The installer's planner on each distribution family, from package facts made by hand."""

import pytest

from hostagent.driver.distro import Distro, parse_os_release, read_distro
from hostagent.driver.packages import PackageFacts, upstream
from hostagent.driver.plan import InstallPlan, NodeState, Service, flavour_for, plan_install, plan_restore
from hostagent.errors import NotFoundError, StateError, UsageError
from hostagent.sim.platform import simulated_host

DEBIAN = Distro("debian", "12", "bookworm", "Debian GNU/Linux 12 (bookworm)", "debian")
UBUNTU = Distro("ubuntu", "22.04", "jammy", "Ubuntu 22.04.4 LTS", "ubuntu")
ROCKY9 = Distro("rocky", "9.4", None, "Rocky Linux 9.4", "rhel")
RHEL10 = Distro("rhel", "10.0", None, "Red Hat Enterprise Linux 10.0", "rhel")
KVER = "6.1.0-28-amd64"
NODE = NodeState(kernel_release=KVER, loaded_modules=("nvidia_modeset", "nvidia_uvm", "nvidia"),
                 architectures=("hopper",), current_version="550.90.07")


def debian_facts(**kw) -> PackageFacts:
    offered = ("550.127.05-1~deb12u1", "550.90.07-1~deb12u1")
    raw = dict(installed={"nvidia-driver": "550.90.07-1~deb12u1", "nvidia-kernel-dkms": "550.90.07-1~deb12u1",
                          "libcuda1": "550.90.07-1~deb12u1", "nvidia-smi": "550.90.07-1~deb12u1"},
               available={n: offered for n in ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-open-kernel-dkms",
                                               "libcuda1", "firmware-nvidia-gsp")},
               held=frozenset())
    raw.update(kw)
    return PackageFacts("apt", **raw)


def steps(plan):
    return {s.name: s for s in plan.steps}


def test_debian_archive_packages_move_together_and_are_held():
    plan = plan_install(DEBIAN, debian_facts(), NODE, "550.127.05")
    assert plan.flavour == "proprietary"
    assert dict(plan.packages) == {n: "550.127.05-1~deb12u1" for n in
                                   ("nvidia-driver", "nvidia-kernel-dkms", "firmware-nvidia-gsp", "libcuda1")}
    assert set(plan.hold) == set(dict(plan.packages))
    install = steps(plan)["install"].commands[0]
    assert install[:3] == ("apt-get", "install", "-y") and "--allow-downgrades" in install
    assert steps(plan)["unload-modules"].commands == (("modprobe", "-r", "nvidia_modeset", "nvidia_uvm", "nvidia"),)
    assert steps(plan)["load-modules"].commands[0] == ("modprobe", "nvidia")
    assert any("nvidia-smi 550.90.07-1~deb12u1 is installed and not offered at 550.127.05" in n for n in plan.notes)
    assert dict(plan.previous_packages)["nvidia-driver"] == "550.90.07-1~deb12u1"
    assert InstallPlan.from_dict(plan.to_dict()) == plan


def test_open_flavour_where_the_gpus_need_it_or_the_branch_defaults_to_it():
    blackwell = NodeState(kernel_release=KVER, architectures=("blackwell",))
    plan = plan_install(DEBIAN, debian_facts(), blackwell, "550.127.05")
    assert plan.flavour == "open" and "nvidia-open-kernel-dkms" in dict(plan.packages)
    assert flavour_for("570.86.15", ("ampere",)) == "open"
    assert flavour_for("550.90.07", ("ampere",)) == "proprietary"
    with pytest.raises(UsageError, match="need the open kernel modules"):
        flavour_for("550.90.07", ("blackwell",), "proprietary")
    with pytest.raises(UsageError, match="older than Turing"):
        flavour_for("550.90.07", ("pre-turing",), "open")


def test_cuda_repository_metapackages_when_the_archive_lacks_the_version():
    facts = PackageFacts("apt", {}, {"nvidia-open": ("570.86.15-1",), "cuda-drivers": ("570.86.15-1",)})
    node = NodeState(kernel_release=KVER, architectures=("hopper",), nvswitch=True)
    plan = plan_install(DEBIAN, facts, node, "570.86.15")
    assert dict(plan.packages) == {"nvidia-open": "570.86.15-1"}
    assert any("fabric manager" in n for n in plan.notes)
    assert plan.services == () and "stop-services" not in steps(plan) and "unload-modules" not in steps(plan)


def test_ubuntu_server_branch_with_signed_precompiled_modules_and_fabric_manager():
    v = "550.127.05-0ubuntu0.22.04.1"
    facts = PackageFacts("apt", {}, {n: (v,) for n in ("nvidia-driver-550-server", "nvidia-utils-550-server",
                                                      "nvidia-compute-utils-550-server", "nvidia-fabricmanager-550")}
                         | {f"linux-modules-nvidia-550-server-{KVER}": ("6.1.0-28.29",)})
    node = NodeState(kernel_release=KVER, architectures=("hopper",), nvswitch=True)
    plan = plan_install(UBUNTU, facts, node, "550.127.05")
    assert dict(plan.packages) == {"nvidia-driver-550-server": v, f"linux-modules-nvidia-550-server-{KVER}": "6.1.0-28.29",
                                   "nvidia-utils-550-server": v, "nvidia-compute-utils-550-server": v,
                                   "nvidia-fabricmanager-550": v}
    dkms = PackageFacts("apt", {}, {n: (v,) for n in ("nvidia-driver-550-server-open", "nvidia-dkms-550-server-open")})
    plan = plan_install(UBUNTU, dkms, NodeState(kernel_release=KVER, architectures=("blackwell",)), "550.127.05")
    assert "nvidia-dkms-550-server-open" in dict(plan.packages)
    assert any("DKMS builds it" in n for n in plan.notes)


def test_rhel_module_streams_and_version_locks():
    v = "3:550.127.05-1.el9"
    facts = PackageFacts("dnf", {}, {n: (v,) for n in ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms")})
    plan = plan_install(ROCKY9, facts, NODE, "550.127.05")
    commands = steps(plan)["install"].commands
    assert commands[0] == ("dnf", "module", "reset", "-y", "nvidia-driver")
    assert commands[1] == ("dnf", "module", "enable", "-y", "nvidia-driver:550-dkms")
    assert commands[2][:4] == ("dnf", "install", "-y", "--allowerasing") and f"nvidia-driver-{v}" in commands[2]
    assert steps(plan)["hold"].commands[0][:3] == ("dnf", "versionlock", "add")
    ten = plan_install(RHEL10, PackageFacts("dnf", {}, {"nvidia-open": ("3:580.65.06-1.el10",)}), NODE, "580.65.06")
    assert dict(ten.packages) == {"nvidia-open": "3:580.65.06-1.el10"}
    assert steps(ten)["install"].commands == (("dnf", "install", "-y", "--allowerasing", "nvidia-open-3:580.65.06-1.el10"),)


def test_refusals_unknown_version_foreign_holds_and_bad_versions():
    with pytest.raises(NotFoundError, match=r"no repository offers nvidia-driver|no repository offers cuda-drivers"):
        plan_install(DEBIAN, debian_facts(), NODE, "999.1.1")
    with pytest.raises(StateError, match="held package"):
        plan_install(DEBIAN, debian_facts(held=frozenset({"libcuda1"})), NODE, "550.127.05")
    ours = NodeState(**{**NODE.__dict__, "our_holds": frozenset({"libcuda1"})})
    plan = plan_install(DEBIAN, debian_facts(held=frozenset({"libcuda1"})), ours, "550.127.05")
    assert plan.unhold == ("libcuda1",) and steps(plan)["unhold"].commands == (("apt-mark", "unhold", "libcuda1"),)
    for bad in ("latest", "550", "550.90.07.1", "", "550.90.07; rm -rf /", "550.127.05\n", " 550.127.05",
                "５５０.127.05"):
        with pytest.raises(UsageError):
            plan_install(DEBIAN, debian_facts(), NODE, bad)


def test_services_are_stopped_before_the_modules_and_started_after():
    node = NodeState(**{**NODE.__dict__, "services": (Service("nvidia-persistenced", unit="nvidia-persistenced.service"),
                                                     Service("nvidia-fabricmanager", pid=42, start=("nv-fabricmanager",)))})
    plan = plan_install(DEBIAN, debian_facts(), node, "550.127.05")
    names = [s.name for s in plan.steps]
    assert names.index("stop-services") < names.index("unload-modules") < names.index("install")
    assert names.index("load-modules") < names.index("start-services") < names.index("verify")
    assert steps(plan)["stop-services"].commands == (("systemctl", "stop", "nvidia-persistenced.service"), ("kill", "42"))
    assert steps(plan)["start-services"].commands == (("systemctl", "start", "nvidia-persistenced.service"),
                                                      ("nv-fabricmanager",))


def test_a_daemon_run_by_systemd_is_restarted_to_load_the_new_library():
    from dataclasses import replace
    by_systemd = plan_install(DEBIAN, debian_facts(), replace(NODE, agent=True, agent_unit="hostagent.service"),
                              "550.127.05")
    assert [s.name for s in by_systemd.steps][-2:] == ["verify", "restart-agent"]
    assert steps(by_systemd)["restart-agent"].commands == (("systemctl", "try-restart", "hostagent.service"),)
    assert not any("restart it" in n for n in by_systemd.notes)
    assert InstallPlan.from_dict(by_systemd.to_dict()) == by_systemd          # journaled as it is
    by_hand = plan_install(DEBIAN, debian_facts(), replace(NODE, agent=True), "550.127.05")
    assert [s.name for s in by_hand.steps][-2:] == ["verify", "resume"]
    assert any("does not run under systemd here: restart it" in n for n in by_hand.notes)
    restore = plan_restore(DEBIAN, debian_facts(), replace(NODE, agent=True, agent_unit="hostagent.service"),
                           [("nvidia-driver", "550.90.07-1~deb12u1")], "550.90.07", "proprietary")
    assert restore.steps[-1].name == "restart-agent"
    no_agent = plan_install(DEBIAN, debian_facts(), NODE, "550.127.05")
    assert no_agent.steps[-1].name == "resume" and not any("hostagent daemon" in n for n in no_agent.notes)


def test_restore_needs_the_old_versions_offered():
    facts = debian_facts()
    plan = plan_restore(DEBIAN, facts, NODE, [("nvidia-driver", "550.90.07-1~deb12u1")], "550.90.07", "proprietary")
    assert plan.operation == "rollback" and plan.packages == (("nvidia-driver", "550.90.07-1~deb12u1"),)
    with pytest.raises(NotFoundError, match="cannot roll back"):
        plan_restore(DEBIAN, facts, NODE, [("nvidia-driver", "535.183.01-1")], "535.183.01", "proprietary")


def test_distributions(tmp_path):
    def distro(text):
        (tmp_path / "etc").mkdir(exist_ok=True)
        (tmp_path / "etc/os-release").write_text(text)
        return read_distro(simulated_host(tmp_path))
    assert distro('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n').family == "ubuntu"
    assert distro('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n').manager == "dnf"
    assert distro('ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n').codename == "bookworm"
    for text in ('ID=sles\nVERSION_ID="15.5"\nPRETTY_NAME="SUSE Linux Enterprise Server 15 SP5"\n',
                 'ID=ubuntu\nVERSION_ID="18.04"\n', 'ID=fedora\nVERSION_ID=40\n'):
        with pytest.raises(StateError, match="does not support"):
            distro(text)
    assert parse_os_release('# c\nNAME="A B"\nBAD\n') == {"NAME": "A B"}
    assert upstream("1:550.90.07-1~deb12u1") == "550.90.07" and upstream("550.90.07") == "550.90.07"
