"""Stand-in NVIDIA driver packages, built with dpkg-deb under Debian's names, that install
what the real ones install where the simulated node reads it: the kernel modules (ELF
objects whose .modinfo carries the version), libnvidia-ml and libcuda with their SONAME
links, and the GSP firmware. After ``apt-get install`` of a version, loading the module
(the simulator's modprobe) brings that version up and ``driver verify`` checks it.

``broken_firmware`` builds a firmware package without the firmware: the driver then fails
``gsp-firmware`` on Hopper, which is how the tests make a new version fail its verification.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from hostagent.sim.elf import shared_object_bytes
from hostagent.sim.kmod import KERNEL_RELEASE, MODULES, module_bytes

__all__ = ["build_repo", "package_version"]

LIB = "usr/lib/x86_64-linux-gnu"


def package_version(version: str) -> str:
    return f"{version}-1"


def _deb(out: Path, name: str, version: str, files: dict, links: dict = (), depends: str = "") -> None:
    tree = out / f"{name}_{version}"
    (tree / "DEBIAN").mkdir(parents=True)
    control = (f"Package: {name}\nVersion: {package_version(version)}\nArchitecture: amd64\n"
               "Maintainer: hostagent tests <tests@localhost>\nSection: non-free/libs\nPriority: optional\n"
               f"Description: stand-in for the NVIDIA driver's {name} {version}\n")
    if depends:
        control += f"Depends: {depends}\n"
    (tree / "DEBIAN/control").write_text(control)
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    for rel, target in dict(links).items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).symlink_to(target)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(tree),
                    str(out / f"{name}_{package_version(version)}_amd64.deb")], check=True, capture_output=True)


def _version(out: Path, version: str, broken_firmware: bool) -> None:
    pv = package_version(version)
    modules = {f"lib/modules/{KERNEL_RELEASE}/updates/dkms/{m}.ko":
               module_bytes({"version": version, "license": "NVIDIA", "name": m.replace("-", "_")})
               for m in MODULES}
    _deb(out, "nvidia-kernel-dkms", version, modules)
    for stem, package in (("libnvidia-ml", "libnvidia-ml1"), ("libcuda", "libcuda1")):
        _deb(out, package, version, {f"{LIB}/{stem}.so.{version}": shared_object_bytes(f"{stem}.so.1")},
             {f"{LIB}/{stem}.so.1": f"{stem}.so.{version}"})
    firmware = {} if broken_firmware else {f"lib/firmware/nvidia/{version}/{n}": b"\0" * 64
                                           for n in ("gsp_ga10x.bin", "gsp_tu10x.bin")}
    _deb(out, "firmware-nvidia-gsp", version, firmware)
    _deb(out, "nvidia-driver", version, {}, depends=", ".join(
        f"{p} (= {pv})" for p in ("nvidia-kernel-dkms", "libnvidia-ml1", "libcuda1", "firmware-nvidia-gsp")))


def build_repo(repo: Path, versions: dict[str, bool]) -> Path:
    """A flat apt repository in ``repo`` with every version (version -> broken firmware)."""
    repo.mkdir(parents=True, exist_ok=True)
    work = repo.parent / f".{repo.name}-build"
    for version, broken in versions.items():
        _version(work, version, broken)
    for deb in work.glob("*.deb"):
        deb.rename(repo / deb.name)
    index = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo, capture_output=True,
                           text=True, check=True)
    (repo / "Packages").write_text(index.stdout)
    return repo
