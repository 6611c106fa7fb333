"""What the package manager knows about the driver's packages: installed versions, the
versions its repositories offer, and holds (``apt-mark hold``, ``dnf versionlock``).

Read through the host's own tools (``dpkg-query``, ``apt-cache``, ``apt-mark``; ``rpm``,
``dnf``) in the host root; nothing here changes the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .system import Runner

__all__ = ["PackageFacts", "gather", "upstream", "DRIVER_PATTERNS"]

# The driver's packages on each family, by name (what is held together and rolled back).
DRIVER_PATTERNS = {
    "apt": re.compile(r"^(nvidia-|libnvidia-|libcuda1|libcudadebugger1|firmware-nvidia-gsp|cuda-drivers|"
                      r"linux-(modules|objects|signatures)-nvidia-|libxnvctrl|xserver-xorg-video-nvidia)"),
    "dnf": re.compile(r"^(nvidia-|kmod-nvidia|cuda-drivers|libnvidia-|dkms-nvidia)"),
}


def upstream(version: str) -> str:
    """The driver version in a package version: "1:550.90.07-1~deb12u1" -> "550.90.07"."""
    version = version.split(":", 1)[-1]
    return version.split("-", 1)[0]


@dataclass(frozen=True)
class PackageFacts:
    manager: str                                   # apt or dnf
    installed: dict = field(default_factory=dict)  # name -> version, the driver's packages
    available: dict = field(default_factory=dict)  # name -> (versions offered, newest first)
    held: frozenset = frozenset()                  # names held / version-locked

    def offered(self, name: str, version: str) -> str | None:
        """The package version of ``name`` whose upstream is ``version``, if offered."""
        return next((v for v in self.available.get(name, ()) if upstream(v) == version), None)


def _apt(runner: Runner, names: list[str]) -> PackageFacts:
    query = runner.run(["dpkg-query", "-W", "-f", "${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"],
                       check=False)
    installed = {}
    for line in query.out.splitlines():
        parts = line.split("\t")
        # db:Status-Abbrev: the wanted state (i install, h hold), then the current one (i installed)
        if len(parts) == 3 and parts[2][1:2] == "i" and DRIVER_PATTERNS["apt"].match(parts[0]):
            installed[parts[0]] = parts[1]
    wanted = sorted(set(names) | set(installed))
    available: dict[str, list[str]] = {}
    if wanted:
        madison = runner.run(["apt-cache", "madison", *wanted], check=False)
        for line in madison.out.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) >= 3 and parts[0] in wanted and parts[1] not in available.get(parts[0], []):
                available.setdefault(parts[0], []).append(parts[1])
    holds = runner.run(["apt-mark", "showhold"], check=False)
    return PackageFacts("apt", installed, {k: tuple(v) for k, v in available.items()},
                        frozenset(holds.out.split()))


def _dnf(runner: Runner, names: list[str]) -> PackageFacts:
    query = runner.run(["rpm", "-qa", "--qf", "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\n"], check=False)
    installed = {}
    for line in query.out.splitlines():
        name, _, version = line.partition("\t")
        if DRIVER_PATTERNS["dnf"].match(name):
            installed[name] = version
    wanted = sorted(set(names) | set(installed))
    available: dict[str, list[str]] = {}
    if wanted:
        listing = runner.run(["dnf", "-q", "list", "--showduplicates", "--available", *wanted], check=False)
        for line in listing.out.splitlines():
            parts = line.split()
            if len(parts) >= 2 and "." in parts[0]:
                name = parts[0].rsplit(".", 1)[0]
                if name in wanted:
                    available.setdefault(name, []).insert(0, parts[1])
    locks = runner.run(["dnf", "-q", "versionlock", "list"], check=False)
    held = {re.sub(r"-\d+:.*$", "", line.strip()) for line in locks.out.splitlines() if line.strip()}
    return PackageFacts("dnf", installed, {k: tuple(v) for k, v in available.items()}, frozenset(held))


def gather(runner: Runner, manager: str, names: list[str]) -> PackageFacts:
    """The driver's packages as ``manager`` knows them, with what is offered of ``names``."""
    return _dnf(runner, names) if manager == "dnf" else _apt(runner, names)
