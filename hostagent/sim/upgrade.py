"""What installing the driver's packages does to a simulated node: the package database
(``sim.packages``) records them, and the node's driver files (libraries, firmware, the
module on disk) move to their version, as the real packages' files do. The package tools'
stand-ins install through it; the ``mismatch`` fault upgrades the files the same way.
"""

from __future__ import annotations

import os
import re

from . import kmod
from .driverroot import upgrade_libraries
from .packages import Distro, PackageDb
from .store import SimStore
from .versions import library_version

__all__ = ["upgrade_packages", "install"]


def upgrade_packages(store: SimStore, old: str, new: str, flavour: str | None = None) -> None:
    """What upgrading the driver's packages leaves on disk: every ``*.so.<old>`` library
    replaced by ``*.so.<new>`` in every library folder (links moved, SONAMEs that carry the
    version changed), the new module built (``flavour``, else the branch's default), the
    firmware renamed."""
    upgrade_libraries(store.root, store.facts.real_device_nodes, old, new)
    firmware = store.root / "lib/firmware/nvidia"
    if old != new and (firmware / old).is_dir():
        os.replace(firmware / old, firmware / new)
    kmod.write_module_files(store.root, new, flavour or kmod.flavour_for(new))


def _slot(name: str) -> str:
    """Packages of one slot cannot be installed side by side: the flavours and branches of
    one package (nvidia-kernel-dkms and nvidia-open-kernel-dkms, nvidia-driver-550-server
    and nvidia-driver-570-server-open, cuda-drivers and nvidia-open)."""
    if name == "nvidia-open":
        return "cuda-drivers"
    return re.sub(r"-\d{3}(?=-|$)", "-BR", name).replace("-open", "").replace("-latest", "")


def install(store, distro: Distro, wanted: dict[str, str]) -> str | None:
    """Install ``wanted`` (name -> version, each offered), replacing what shares a slot with
    them (``--allowerasing``, apt's conflicts); the driver's files move to the version of
    its packages. Returns the driver version now on disk if it changed."""
    db = PackageDb.load(store.root)
    slots = {_slot(n) for n in wanted}
    db.installed = {n: v for n, v in db.installed.items() if n in wanted or _slot(n) not in slots}
    db.installed.update(wanted)
    db.save(store.root)
    driver = {v.split(":", 1)[-1].split("-", 1)[0] for n, v in wanted.items() if not n.startswith("linux-headers")}
    if len(driver) != 1:
        return None
    new = driver.pop()
    old = library_version(store.root)
    open_modules = any("open" in n for n in wanted)
    if new == old and not open_modules:
        return None
    upgrade_packages(store, old, new, "open" if open_modules else None)
    return new
