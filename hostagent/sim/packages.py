"""The simulated node's distribution and what its package manager knows of the NVIDIA driver:
``/etc/os-release``, the repositories' driver packages (the node's own version and a few
others, under each distribution's names and version forms) and the installed ones, kept in
``.sim/packages.json`` beside the node's state. The package tools' stand-ins
(``sim.tools.apt``, ``sim.tools.dnf``) read it and install through ``sim.upgrade``, which
moves the node's driver files to the version installed, as the real packages do, so
``driver install`` can be tried from end to end on a simulated node.

Debian ships the driver in ``non-free``: without that component in
``/etc/apt/sources.list`` its repositories offer none of the driver's packages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import UsageError
from ..fileio import write_atomic
from .kmod import KERNEL_RELEASE

__all__ = ["DISTROS", "DEFAULT_DISTRO", "Distro", "distro_of", "write_distro", "offered", "PackageDb",
           "initial_packages", "OTHER_VERSIONS"]

# Driver versions the simulated repositories offer besides the node's own.
OTHER_VERSIONS = ("535.216.03", "550.90.07", "550.127.05", "570.86.15")


@dataclass(frozen=True)
class Distro:
    name: str                # debian-12
    family: str              # debian, ubuntu or rhel
    os_release: dict         # the fields of /etc/os-release

    def package_version(self, version: str) -> str:
        """A driver version as this distribution's packages carry it."""
        if self.family == "ubuntu":
            return f"{version}-0ubuntu0.{self.os_release['VERSION_ID']}.1"
        if self.family == "rhel":
            return f"3:{version}-1.el{self.os_release['VERSION_ID'].split('.')[0]}"
        return f"{version}-1"


def _distro(name: str, family: str, os_name: str, pretty: str, version: str, codename: str | None = None,
            **more) -> Distro:
    fields = {"PRETTY_NAME": pretty, "NAME": os_name, "ID": name.rsplit("-", 1)[0], "VERSION_ID": version, **more}
    if codename:
        fields["VERSION_CODENAME"] = codename
    return Distro(name, family, fields)


DISTROS = {d.name: d for d in (
    _distro("debian-11", "debian", "Debian GNU/Linux", "Debian GNU/Linux 11 (bullseye)", "11", "bullseye"),
    _distro("debian-12", "debian", "Debian GNU/Linux", "Debian GNU/Linux 12 (bookworm)", "12", "bookworm"),
    _distro("ubuntu-20.04", "ubuntu", "Ubuntu", "Ubuntu 20.04.6 LTS", "20.04", "focal", ID_LIKE="debian"),
    _distro("ubuntu-22.04", "ubuntu", "Ubuntu", "Ubuntu 22.04.5 LTS", "22.04", "jammy", ID_LIKE="debian"),
    _distro("ubuntu-24.04", "ubuntu", "Ubuntu", "Ubuntu 24.04.1 LTS", "24.04", "noble", ID_LIKE="debian"),
    _distro("rhel-9", "rhel", "Red Hat Enterprise Linux", "Red Hat Enterprise Linux 9.4 (Plow)", "9.4",
            ID_LIKE="fedora"),
    _distro("rocky-9", "rhel", "Rocky Linux", "Rocky Linux 9.4 (Blue Onyx)", "9.4", ID_LIKE="rhel centos fedora"),
)}
DEFAULT_DISTRO = "debian-12"           # the simulated kernel is Debian 12's
_DEBIAN_MIRROR = "http://deb.debian.org/debian"


def check_distro(name: str) -> Distro:
    if name not in DISTROS:
        from ..suggest import unknown
        raise UsageError(unknown("distribution", name, DISTROS), hint=f"one of {', '.join(DISTROS)}")
    return DISTROS[name]


def write_distro(root, name: str) -> Distro:
    """The distribution's /etc/os-release, and Debian's package sources (with non-free)."""
    distro = check_distro(name)
    text = "".join(f'{k}="{v}"\n' for k, v in distro.os_release.items())
    (root / "etc").mkdir(parents=True, exist_ok=True)
    write_atomic(root / "etc/os-release", text)
    if distro.family == "debian":
        (root / "etc/apt").mkdir(parents=True, exist_ok=True)
        write_atomic(root / "etc/apt/sources.list",
                     f"deb {_DEBIAN_MIRROR} {distro.os_release['VERSION_CODENAME']} main contrib non-free "
                     "non-free-firmware\n")
    return distro


def distro_of(root) -> Distro | None:
    """The node's distribution, by its /etc/os-release; None for a node made without one."""
    try:
        text = (root / "etc/os-release").read_text()
    except FileNotFoundError:
        return None
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    fields = {k: v.strip('"') for k, v in fields.items()}
    return next((d for d in DISTROS.values() if d.os_release["ID"] == fields.get("ID")
                 and d.os_release["VERSION_ID"] == fields.get("VERSION_ID")), None)


def _packages(distro: Distro, version: str, flavour: str | None) -> list[str]:
    """The driver's packages of ``version``, under the distribution's names (both flavours
    where ``flavour`` is None)."""
    br = version.split(".")[0]
    flavours = ("proprietary", "open") if flavour is None else (flavour,)
    suffixes = ["-open" if f == "open" else "" for f in flavours]
    if distro.family == "debian":
        kernel = ["nvidia-open-kernel-dkms" if f == "open" else "nvidia-kernel-dkms" for f in flavours]
        return ["nvidia-driver", *kernel, "firmware-nvidia-gsp"]
    if distro.family == "ubuntu":
        return [n for s in suffixes for n in (f"nvidia-driver-{br}-server{s}", f"nvidia-dkms-{br}-server{s}",
                                              f"linux-modules-nvidia-{br}-server{s}-{KERNEL_RELEASE}")] + [
            f"nvidia-utils-{br}-server", f"nvidia-compute-utils-{br}-server", f"nvidia-fabricmanager-{br}"]
    kmods = ["kmod-nvidia-open-dkms" if f == "open" else "kmod-nvidia-latest-dkms" for f in flavours]
    metas = ["nvidia-open" if f == "open" else "cuda-drivers" for f in flavours]
    return ["nvidia-driver", "nvidia-driver-cuda", *kmods, *metas, "nvidia-fabric-manager"]


def initial_packages(distro: Distro, version: str, flavour: str) -> dict[str, str]:
    """What a node installed with ``version`` (and the running kernel's headers) has."""
    br = version.split(".")[0]
    pv = distro.package_version(version)
    if distro.family == "debian":
        kernel = "nvidia-open-kernel-dkms" if flavour == "open" else "nvidia-kernel-dkms"
        return {"nvidia-driver": pv, kernel: pv, "firmware-nvidia-gsp": pv,
                f"linux-headers-{KERNEL_RELEASE}": "6.1.119-1"}
    if distro.family == "ubuntu":
        s = "-open" if flavour == "open" else ""
        return {f"nvidia-driver-{br}-server{s}": pv, f"linux-modules-nvidia-{br}-server{s}-{KERNEL_RELEASE}": pv,
                f"nvidia-utils-{br}-server": pv, f"nvidia-compute-utils-{br}-server": pv}
    kmod = "kmod-nvidia-open-dkms" if flavour == "open" else "kmod-nvidia-latest-dkms"
    return {"nvidia-driver": pv, "nvidia-driver-cuda": pv, kmod: pv}


def _components(root) -> set[str]:
    try:
        lines = (root / "etc/apt/sources.list").read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {c for line in lines if line.startswith("deb ") for c in line.split()[3:]}


def offered(root, distro: Distro, node_version: str) -> dict[str, list[str]]:
    """Package name -> the versions the repositories offer, oldest first."""
    out: dict[str, list[str]] = {}
    if distro.family == "debian":
        out[f"linux-headers-{KERNEL_RELEASE}"] = ["6.1.119-1"]          # in main
        if "non-free" not in _components(root):
            return out
    for version in sorted({node_version, *OTHER_VERSIONS}, key=lambda v: tuple(map(int, v.split(".")))):
        for name in _packages(distro, version, None):
            out.setdefault(name, []).append(distro.package_version(version))
    return out


@dataclass
class PackageDb:
    installed: dict                  # name -> version
    held: set

    @staticmethod
    def path(root):
        return root / ".sim/packages.json"

    @classmethod
    def load(cls, root) -> "PackageDb":
        try:
            raw = json.loads(cls.path(root).read_text())
        except FileNotFoundError:
            return cls({}, set())
        return cls(dict(raw["installed"]), set(raw["held"]))

    def save(self, root) -> None:
        write_atomic(self.path(root), json.dumps({"installed": self.installed, "held": sorted(self.held)},
                                                 indent=1))
