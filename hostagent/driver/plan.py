"""The driver installer's planner: from the distribution, what its package manager offers,
and the node's state, the packages a user of that distribution would install for a driver
version, and every step of installing them. Pure: no host access.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..errors import NotFoundError, StateError, UsageError
from .distro import Distro
from .packages import PackageFacts

__all__ = ["NodeState", "Service", "Step", "InstallPlan", "plan_install", "plan_restore", "check_version",
           "wanted_names", "flavour_for", "MODULE_UNLOAD_ORDER", "MODULE_LOAD_ORDER"]

VERSION = re.compile(r"[0-9]{3,4}\.[0-9]{1,3}(\.[0-9]{1,3})?")     # the whole value (fullmatch), ASCII digits
# As NVIDIA's driver manager unloads them (k8s-driver-manager) and its container loads them.
MODULE_UNLOAD_ORDER = ("nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia")
MODULE_LOAD_ORDER = ("nvidia", "nvidia-uvm", "nvidia-modeset")
NEEDS_OPEN = ("blackwell",)
NEEDS_PROPRIETARY = ("pre-turing",)


@dataclass(frozen=True)
class Service:
    """A driver daemon that holds the GPUs: stopped before the modules go, started after."""
    name: str                      # nvidia-persistenced, nvidia-fabricmanager, nvidia-dcgm
    unit: str | None = None        # managed by systemd: its unit
    pid: int | None = None         # else its process (from its pid file)
    start: tuple[str, ...] = ()    # how to start it again without systemd


@dataclass(frozen=True)
class NodeState:
    """What the planner needs of the node besides its packages."""
    kernel_release: str | None = None
    loaded_modules: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    nvswitch: bool = False
    current_version: str | None = None
    services: tuple[Service, ...] = ()
    users: tuple[str, ...] = ()    # allocations and processes still using GPUs, one line each
    agent: bool = False            # a hostagent daemon runs (asked to hold its GPU work)
    agent_unit: str | None = None  # the systemd unit it runs in: restarted once the driver changed
    our_holds: frozenset = frozenset()   # holds an earlier install placed


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    commands: tuple[tuple[str, ...], ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "commands": [list(c) for c in self.commands]}


@dataclass(frozen=True)
class InstallPlan:
    operation: str                       # install or rollback
    distro: str
    manager: str
    version: str                         # the driver version it installs
    previous: str | None                 # the version loaded before
    flavour: str
    packages: tuple[tuple[str, str], ...]    # (name, package version) to install
    previous_packages: tuple[tuple[str, str], ...]  # what a rollback restores
    hold: tuple[str, ...]
    unhold: tuple[str, ...]
    steps: tuple[Step, ...]
    users: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    services: tuple[Service, ...] = ()

    def to_dict(self) -> dict:
        out = asdict(self)
        out["packages"] = [list(p) for p in self.packages]
        out["previous_packages"] = [list(p) for p in self.previous_packages]
        out["steps"] = [s.to_dict() for s in self.steps]
        out["services"] = [asdict(s) for s in self.services]
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> "InstallPlan":
        raw = dict(raw)
        raw["packages"] = tuple(tuple(p) for p in raw["packages"])
        raw["previous_packages"] = tuple(tuple(p) for p in raw["previous_packages"])
        raw["steps"] = tuple(Step(s["name"], s["title"], tuple(tuple(c) for c in s["commands"]))
                             for s in raw["steps"])
        raw["services"] = tuple(Service(**{**s, "start": tuple(s["start"])}) for s in raw["services"])
        for key in ("hold", "unhold", "users", "notes"):
            raw[key] = tuple(raw[key])
        return cls(**raw)


def check_version(version: str) -> str:
    """The version as given, if it is one (digits and dots, nothing around them)."""
    version = version or ""
    if not VERSION.fullmatch(version):
        raise UsageError(f"{version!r} is not an NVIDIA driver version", hint="give one like 550.90.07")
    return version


def flavour_for(version: str, architectures, requested: str = "auto") -> str:
    """The module flavour: what the GPUs require, else what NVIDIA installs by default for the
    branch (open from R560: gpu-driver-container's _resolve_kernel_type_from_driver_branch)."""
    need_open = any(a in NEEDS_OPEN for a in architectures)
    need_prop = any(a in NEEDS_PROPRIETARY for a in architectures)
    if requested == "open" and need_prop:
        raise UsageError("the open kernel modules cannot drive GPUs older than Turing on this node",
                         hint="use --flavour proprietary (or auto)")
    if requested == "proprietary" and need_open:
        raise UsageError("Blackwell and newer GPUs need the open kernel modules", hint="use --flavour open (or auto)")
    if requested != "auto":
        return requested
    if need_open or need_prop:
        return "open" if need_open else "proprietary"
    return "open" if int(version.split(".")[0]) >= 560 else "proprietary"


def _branch(version: str) -> str:
    return version.split(".")[0]


def wanted_names(distro: Distro, version: str, node: NodeState) -> list[str]:
    """Every package whose offered versions the planner looks at."""
    br, kver = _branch(version), node.kernel_release or "unknown"
    if distro.family == "ubuntu":
        return [f"nvidia-driver-{br}-server", f"nvidia-driver-{br}-server-open",
                f"linux-modules-nvidia-{br}-server-{kver}", f"linux-modules-nvidia-{br}-server-open-{kver}",
                f"nvidia-dkms-{br}-server", f"nvidia-dkms-{br}-server-open", f"nvidia-utils-{br}-server",
                f"nvidia-compute-utils-{br}-server", f"nvidia-fabricmanager-{br}", f"libnvidia-nscq-{br}"]
    if distro.family == "debian":
        return ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-open-kernel-dkms", "firmware-nvidia-gsp",
                "nvidia-open", "cuda-drivers", f"nvidia-fabricmanager-{br}", "nvidia-fabricmanager",
                f"linux-headers-{kver}"]
    return ["nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms", "kmod-nvidia-open-dkms",
            "nvidia-open", "cuda-drivers", "nvidia-fabric-manager", "nvidia-persistenced"]


# Packages that are one kernel-module flavour of the driver (open or proprietary).
_FLAVOURED = re.compile(r"open|^nvidia-kernel-dkms$|^kmod-nvidia-latest-dkms$|^cuda-drivers$|"
                        r"^(nvidia-driver|nvidia-dkms|linux-modules-nvidia)-\d+-server")


def _require(pkgs: PackageFacts, name: str, version: str) -> str:
    found = pkgs.offered(name, version)
    if found is None:
        offered = ", ".join(pkgs.available.get(name, ())) or "none"
        raise NotFoundError(f"no repository offers {name} {version} (offered: {offered})",
                            hint="check the version, add the repository that has it, and refresh the "
                                 "package lists (apt-get update / dnf makecache)")
    return found


def _debian(pkgs, version, flavour, node, distro) -> tuple[list, list]:
    notes = []
    kernel = "nvidia-open-kernel-dkms" if flavour == "open" else "nvidia-kernel-dkms"
    if pkgs.offered("nvidia-driver", version) and pkgs.offered(kernel, version):
        chosen = [("nvidia-driver", _require(pkgs, "nvidia-driver", version)),
                  (kernel, _require(pkgs, kernel, version))]
        if pkgs.offered("firmware-nvidia-gsp", version):
            chosen.append(("firmware-nvidia-gsp", pkgs.offered("firmware-nvidia-gsp", version)))
    elif pkgs.offered("nvidia-driver", version):
        chosen = [("nvidia-driver", _require(pkgs, "nvidia-driver", version)), (kernel, _require(pkgs, kernel, version))]
    else:                          # NVIDIA's CUDA repository: nvidia-open / cuda-drivers
        meta = "nvidia-open" if flavour == "open" else "cuda-drivers"
        if not pkgs.offered(meta, version):
            offered = ", ".join(pkgs.available.get("nvidia-driver", ())) or "none"
            hint = "check the version, add the repository that has it, and refresh the package lists (apt-get update)"
            if not pkgs.available.get("nvidia-driver") and not pkgs.available.get(meta):
                hint = (f"Debian ships the driver in its non-free component and the GSP firmware in "
                        f"non-free-firmware: add both to the sources (deb http://deb.debian.org/debian "
                        f"{distro.codename or 'CODENAME'} main contrib non-free non-free-firmware), then "
                        "apt-get update and retry")
            raise NotFoundError(f"no repository offers nvidia-driver {version} (offered: {offered}), nor "
                                f"NVIDIA's repository {meta} {version}", hint=hint)
        chosen = [(meta, _require(pkgs, meta, version))]
    if any(name.endswith("-dkms") for name, _ in chosen):       # DKMS builds the module: the kernel's headers
        headers = f"linux-headers-{node.kernel_release}"
        if node.kernel_release and pkgs.available.get(headers):
            chosen.append((headers, pkgs.available[headers][0]))
        else:
            notes.append(f"DKMS builds the module, and no repository offers {headers}: install the running "
                         "kernel's headers first")
    return chosen, notes


def _ubuntu(pkgs, version, flavour, node) -> tuple[list, list]:
    br, suffix = _branch(version), "-open" if flavour == "open" else ""
    chosen = [(f"nvidia-driver-{br}-server{suffix}", _require(pkgs, f"nvidia-driver-{br}-server{suffix}", version))]
    signed = f"linux-modules-nvidia-{br}-server{suffix}-{node.kernel_release}"
    notes = []
    if node.kernel_release and pkgs.available.get(signed):
        chosen.append((signed, pkgs.available[signed][0]))     # Canonical-signed: works with Secure Boot
    else:
        chosen.append((f"nvidia-dkms-{br}-server{suffix}", _require(pkgs, f"nvidia-dkms-{br}-server{suffix}", version)))
        notes.append(f"no signed precompiled module for kernel {node.kernel_release}: DKMS builds it "
                     "(needs the kernel headers; under Secure Boot, an enrolled MOK)")
    for name in (f"nvidia-utils-{br}-server", f"nvidia-compute-utils-{br}-server"):
        if pkgs.offered(name, version):
            chosen.append((name, pkgs.offered(name, version)))
    return chosen, notes


def _choose(distro: Distro, pkgs: PackageFacts, version: str, flavour: str, node: NodeState):
    if distro.family == "ubuntu":
        chosen, notes = _ubuntu(pkgs, version, flavour, node)
    elif distro.family == "debian":
        chosen, notes = _debian(pkgs, version, flavour, node, distro)
    else:
        meta = "nvidia-open" if flavour == "open" else "cuda-drivers"
        if distro.major < 10 and pkgs.offered("nvidia-driver", version):
            kmod = "kmod-nvidia-open-dkms" if flavour == "open" else "kmod-nvidia-latest-dkms"
            chosen = [("nvidia-driver", _require(pkgs, "nvidia-driver", version)),
                      ("nvidia-driver-cuda", _require(pkgs, "nvidia-driver-cuda", version)),
                      (kmod, _require(pkgs, kmod, version))]
        else:
            chosen = [(meta, _require(pkgs, meta, version))]
        notes = []
    if node.nvswitch:
        fm = next((n for n in (f"nvidia-fabricmanager-{_branch(version)}", "nvidia-fabricmanager",
                               "nvidia-fabric-manager") if pkgs.offered(n, version)), None)
        if fm:
            chosen.append((fm, pkgs.offered(fm, version)))
        else:
            notes.append(f"NVSwitch system: no repository offers the fabric manager {version}; install "
                         "nvidia-fabricmanager of exactly this version from NVIDIA's repository")
    names = {n for n, _ in chosen}
    # Installed driver packages offered at the new version move with it (kept in step),
    # except those of a kernel-module flavour: the flavour chosen above decides those.
    for name in sorted(pkgs.installed):
        if name not in names and pkgs.offered(name, version) and not _FLAVOURED.search(name):
            chosen.append((name, pkgs.offered(name, version)))
            names.add(name)
    for name in sorted(set(pkgs.installed) - names):
        notes.append(f"{name} {pkgs.installed[name]} is installed and not offered at {version}: it stays")
    return chosen, notes


def _manager_steps(distro: Distro, packages, hold, unhold, version: str, flavour: str) -> list[Step]:
    steps = []
    if distro.manager == "apt":
        if unhold:
            steps.append(Step("unhold", "release the holds an earlier install placed",
                              (("apt-mark", "unhold", *unhold),)))
        steps.append(Step("install", f"install the driver {version} ({flavour} kernel modules)",
                          (("apt-get", "install", "-y", "-q", "--allow-downgrades", "--no-install-recommends",
                            "-o", "Dpkg::Options::=--force-confold", *(f"{n}={v}" for n, v in packages)),)))
        steps.append(Step("hold", "hold the driver's packages at this version (unattended upgrades "
                          "would otherwise cause a version mismatch)", (("apt-mark", "hold", *hold),)))
        return steps
    if unhold:
        steps.append(Step("unhold", "release the version locks an earlier install placed",
                          (("dnf", "versionlock", "delete", *unhold),)))
    commands = []
    if distro.major < 10 and any(n == "nvidia-driver" for n, _ in packages):
        stream = f"{_branch(version)}-open" if flavour == "open" else f"{_branch(version)}-dkms"
        commands += [("dnf", "module", "reset", "-y", "nvidia-driver"),
                     ("dnf", "module", "enable", "-y", f"nvidia-driver:{stream}")]
    commands.append(("dnf", "install", "-y", "--allowerasing", *(f"{n}-{v}" for n, v in packages)))
    steps.append(Step("install", f"install the driver {version} ({flavour} kernel modules)", tuple(commands)))
    steps.append(Step("hold", "lock the driver's packages at this version",
                      (("dnf", "versionlock", "add", *(f"{n}-{v}" for n, v in packages if n in hold)),)))
    return steps


def _steps(node: NodeState, manager_steps: list[Step], version: str) -> tuple[Step, ...]:
    steps = [Step("maintenance", "refuse new allocations: the agent holds MIG changes, stops its MPS "
                  "daemons and lets go of NVML" if node.agent else "no hostagent daemon runs: nothing to hold")]
    steps.append(Step("check-users", "no allocation or process may still use a GPU (--force to go on)"
                      + (f": {len(node.users)} do" if node.users else "")))
    if node.services:
        steps.append(Step("stop-services", "stop the driver's daemons",
                          tuple(("systemctl", "stop", s.unit) if s.unit else ("kill", str(s.pid))
                                for s in node.services)))
    loaded = tuple(m for m in MODULE_UNLOAD_ORDER if m in node.loaded_modules)
    if loaded:
        steps.append(Step("unload-modules", "unload the kernel modules (refused while anything holds them)",
                          (("modprobe", "-r", *loaded),)))
    steps += manager_steps
    steps.append(Step("load-modules", f"load the {version} kernel modules",
                      tuple(("modprobe", m) for m in MODULE_LOAD_ORDER)))
    steps.append(Step("create-nodes", "create the device nodes the driver's users need"))
    if node.services:
        steps.append(Step("start-services", "start the driver's daemons again",
                          tuple(("systemctl", "start", s.unit) if s.unit else s.start for s in node.services)))
    steps.append(Step("verify", "verify the driver (hostagent driver verify); on failure roll back"))
    if node.agent_unit:
        # A running process keeps the NVML library it loaded: only a new daemon uses the new
        # driver's. It starts out of maintenance and verifies the driver first.
        steps.append(Step("restart-agent", "restart the hostagent daemon so it loads the new driver's NVML "
                          "library (it verifies the driver at start)",
                          (("systemctl", "try-restart", node.agent_unit),)))
    else:
        steps.append(Step("resume", "let the agent use the GPUs again" if node.agent else "done"))
    return tuple(steps)


def _agent_notes(node: NodeState) -> list[str]:
    if node.agent and not node.agent_unit:
        return ["the hostagent daemon does not run under systemd here: restart it once the driver changed, "
                "so it loads the new NVML library (a running process keeps the one it loaded)"]
    return []


def _check_holds(pkgs: PackageFacts, node: NodeState, names) -> None:
    foreign = sorted(n for n in names if n in pkgs.held and n not in node.our_holds)
    if foreign:
        tool = "apt-mark unhold" if pkgs.manager == "apt" else "dnf versionlock delete"
        raise StateError(f"held package(s) {', '.join(foreign)}: someone pinned them on purpose",
                         hint=f"release them ({tool} {' '.join(foreign)}) if the change is wanted, then retry")


def plan_install(distro: Distro, pkgs: PackageFacts, node: NodeState, version: str, *,
                 flavour: str = "auto") -> InstallPlan:
    version = check_version(version)
    chosen_flavour = flavour_for(version, node.architectures, flavour)
    packages, notes = _choose(distro, pkgs, version, chosen_flavour, node)
    _check_holds(pkgs, node, [n for n, _ in packages if not n.startswith("linux-headers-")])
    previous = tuple(sorted(pkgs.installed.items()))
    for name, old in previous:
        if old not in pkgs.available.get(name, ()):
            notes.append(f"rollback: no repository offers {name} {old} any more, so a failed verification "
                         "cannot restore it")
    hold = tuple(n for n, _ in packages if not n.startswith("linux-headers-"))      # the driver's own
    unhold = tuple(sorted(n for n in node.our_holds if n in pkgs.held))
    steps = _steps(node, _manager_steps(distro, packages, hold, unhold, version, chosen_flavour), version)
    notes += _agent_notes(node)
    return InstallPlan("install", distro.name, distro.manager, version, node.current_version, chosen_flavour,
                       tuple(packages), previous, hold, unhold, steps, node.users, tuple(notes), node.services)


def plan_restore(distro: Distro, pkgs: PackageFacts, node: NodeState, packages, version: str,
                 flavour: str) -> InstallPlan:
    """Put ``packages`` (name, package version) back: a rollback."""
    packages = tuple(tuple(p) for p in packages)
    missing = [f"{n} {v}" for n, v in packages if v not in pkgs.available.get(n, ()) and pkgs.installed.get(n) != v]
    if missing:
        raise NotFoundError(f"cannot roll back: no repository offers {', '.join(missing)} any more",
                            hint="install a driver version the repositories offer with 'hostagent driver "
                                 "install --version V'")
    hold = tuple(n for n, _ in packages)
    unhold = tuple(sorted(n for n in node.our_holds if n in pkgs.held))
    _check_holds(pkgs, node, hold)
    steps = _steps(node, _manager_steps(distro, packages, hold, unhold, version, flavour), version)
    return InstallPlan("rollback", distro.name, distro.manager, version, node.current_version, flavour,
                       packages, tuple(sorted(pkgs.installed.items())), hold, unhold, steps, node.users,
                       tuple(_agent_notes(node)), node.services)
