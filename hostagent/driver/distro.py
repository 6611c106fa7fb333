"""Which distribution the host runs (``/etc/os-release``), and so which package manager and
driver packages the installer uses."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..errors import NotFoundError, StateError
from ..hostroot import HostRoot

__all__ = ["Distro", "read_distro", "parse_os_release", "SUPPORTED"]

SUPPORTED = "Debian 11-13, Ubuntu 20.04-24.04, RHEL, Rocky, AlmaLinux, CentOS Stream and Oracle Linux 8-10"
_RHEL_LIKE = ("rhel", "rocky", "almalinux", "centos", "ol", "fedora")


@dataclass(frozen=True)
class Distro:
    id: str                 # debian, ubuntu, rhel, rocky, ...
    version: str            # VERSION_ID: "12", "22.04", "9.4"
    codename: str | None
    name: str               # PRETTY_NAME
    family: str             # debian, ubuntu or rhel

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def manager(self) -> str:
        return "dnf" if self.family == "rhel" else "apt"


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            try:
                parts = shlex.split(value)
            except ValueError:
                parts = [value]
            out[key.strip()] = parts[0] if parts else ""
    return out


def _family(fields: dict) -> str | None:
    ids = [fields.get("ID", "").lower(), *fields.get("ID_LIKE", "").lower().split()]
    if ids[0] == "ubuntu":
        return "ubuntu"
    if ids[0] == "debian":
        return "debian"
    if ids[0] in _RHEL_LIKE or any(i in ("rhel", "centos", "fedora") for i in ids[1:]):
        return "rhel"
    return None


def read_distro(host: HostRoot) -> Distro:
    for rel in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            fields = parse_os_release(host.host(rel).read_text())
            break
        except FileNotFoundError:
            continue
    else:
        hint = (f"a simulated node carries one from 'hostagent sim create --distro NAME': recreate it with "
                f"--force --distro debian-12 --root {host.root}" if host.simulated
                else f"the driver installer supports {SUPPORTED}")
        raise NotFoundError("the host says no distribution: no /etc/os-release",
                            where=str(host.host("/etc/os-release")), hint=hint)
    name = fields.get("PRETTY_NAME") or fields.get("NAME") or fields.get("ID", "unknown")
    family = _family(fields)
    version = fields.get("VERSION_ID", "")
    supported = {"debian": lambda v: 11 <= v <= 13, "ubuntu": lambda v: 20 <= v <= 24,
                 "rhel": lambda v: 8 <= v <= 10}
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = -1
    if family is None or not supported[family](major) or (family == "rhel" and fields.get("ID") == "fedora"):
        raise StateError(f"the driver installer does not support {name}", where=str(host.host("/etc/os-release")),
                         hint=f"it supports {SUPPORTED}; install the driver with the distribution's own tools, "
                              "then check it with 'hostagent driver verify'")
    return Distro(id=fields.get("ID", family), version=version,
                  codename=fields.get("VERSION_CODENAME") or None, name=name, family=family)
