"""Driver faults a simulated node can have, each made the way a real host shows it: in the
driver root's files (/sys, /proc, /dev, libraries, firmware, the kernel log) and in what the
fake NVML answers. ``inject`` breaks the node; ``clear`` applies the fix an admin would.
"""

from __future__ import annotations

import os
import shutil

from ..errors import StateError, UnknownName, UsageError
from . import control, kmod
from .files import NodeFiles
from .store import SimStore

__all__ = ["FAULTS", "inject", "clear"]

FAULTS = {
    "mismatch": "the driver's packages are upgraded (libraries, module on disk, firmware) while the "
                "old kernel module stays loaded: NVML fails with a version mismatch",
    "no-uvm": "/dev/nvidia-uvm and /dev/nvidia-uvm-tools are missing (nothing made them)",
    "nouveau": "nouveau is loaded and holds the GPUs; the nvidia module is not loaded",
    "unloaded": "the nvidia kernel module is not loaded",
    "no-firmware": "the GSP firmware of the loaded driver version is missing",
    "fm-down": "the fabric manager is stopped: the NVSwitch fabric never registers",
    "gpu-lost": "a GPU falls off the bus (Xid 79; NVML answers GPU_IS_LOST for it)",
}


def _bump(version: str) -> str:
    major, minor, *rest = version.split(".")
    return ".".join([major, str(int(minor) + 1), *rest])


def _record_upgrade(store: SimStore, new: str) -> None:
    """The package database follows: the driver's packages are at ``new`` now."""
    from .packages import PackageDb, distro_of
    distro = distro_of(store.root)
    if distro is None:
        return
    db = PackageDb.load(store.root)
    db.installed = {n: v if n.startswith("linux-headers-") else distro.package_version(new)
                    for n, v in db.installed.items()}
    db.save(store.root)


def _mismatch(store: SimStore, version: str | None) -> str:
    with store.mutate() as state:
        if not state.driver_loaded:
            raise StateError("the driver is not loaded: a mismatch needs a loaded module",
                             hint="load it first: hostagent sim driver load")
        old = kmod.loaded_version(store.facts, state)
        new = version or _bump(old)
        if new == old:
            raise UsageError(f"the loaded module is already {old}", hint="pass another --version")
        from .upgrade import upgrade_packages
        upgrade_packages(store, old, new)
        _record_upgrade(store, new)
        kmod.log(store.root, f"NVRM: API mismatch: the client has the version {new}, but",
                 f"NVRM: this kernel module has the version {old}.  Please",
                 "NVRM: make sure that this kernel module and all NVIDIA driver",
                 "NVRM: components have the same version.", level=3)
    return f"libraries and module on disk upgraded to {new}; {old} stays loaded"


def _uvm_nodes(store: SimStore, present: bool) -> None:
    w = NodeFiles(store.root, store.facts.real_device_nodes)
    major = store.facts.majors["nvidia-uvm"]
    for name, minor in (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)):
        path = store.root / "dev" / name
        if present:
            w.chardev(f"dev/{name}", major, minor)
        elif os.path.lexists(path):
            path.unlink()


def _nouveau(store: SimStore, present: bool) -> None:
    if present:
        kmod.unload(store)
        with store.mutate() as state:
            state.driver["nouveau"] = True
            kmod.nouveau_files(store.root, True)
            kmod.bind_all(store.root, state, "nouveau")
            kmod.log(store.root, *(f"nouveau {g.pci_bus_id}: NVIDIA GPU (bound by nouveau)"
                                   for g in state.gpus))
    else:
        with store.mutate() as state:
            state.driver.pop("nouveau", None)
            kmod.nouveau_files(store.root, False)
            kmod.bind_all(store.root, state, None)
        kmod.load(store)


def _firmware(store: SimStore, present: bool) -> None:
    from .driverroot import FIRMWARE
    version = kmod.loaded_version(store.facts, store.read())
    directory = store.root / "lib/firmware/nvidia" / version
    if present:
        w = NodeFiles(store.root, store.facts.real_device_nodes)
        for name in FIRMWARE:
            w.file(f"lib/firmware/nvidia/{version}/{name}", b"\0" * 64)
    else:
        shutil.rmtree(directory, ignore_errors=True)


def _fabric_manager(store: SimStore, running: bool) -> None:
    if not store.facts.nvswitches:
        raise StateError(f"the '{store.facts.profile}' node has no NVSwitch, so no fabric manager",
                         hint="use an HGX profile (hgx-h100, hgx-h200)")
    with store.mutate() as state:
        state.driver["fabric_manager"] = running


def _gpu(gpu: int | None) -> int:
    if gpu is None:
        raise UsageError("gpu-lost needs --gpu N")
    return gpu


def inject(store: SimStore, name: str, *, gpu: int | None = None, version: str | None = None) -> str:
    """Break the node in the way ``name`` says; returns what was done."""
    if name == "mismatch":
        return _mismatch(store, version)
    if name == "no-uvm":
        _uvm_nodes(store, False)
    elif name == "nouveau":
        _nouveau(store, True)
    elif name == "unloaded":
        kmod.unload(store)
    elif name == "no-firmware":
        _firmware(store, False)
    elif name == "fm-down":
        _fabric_manager(store, False)
    elif name == "gpu-lost":
        control.lose_gpu(store, _gpu(gpu))
    else:
        raise UnknownName(f"no driver fault named {name!r}", name=name, hint=f"choose one of: {', '.join(FAULTS)}")
    return FAULTS[name]


def clear(store: SimStore, name: str, *, gpu: int | None = None) -> str:
    """Apply the fix an admin would for ``name``; returns what was done."""
    if name == "mismatch":            # the fix is a reload (or a reboot): the new module comes up
        kmod.unload(store)
        kmod.load(store)
        return f"driver reloaded: {kmod.loaded_version(store.facts, store.read())} is loaded"
    if name == "no-uvm":
        _uvm_nodes(store, True)
        return "/dev/nvidia-uvm and /dev/nvidia-uvm-tools created (as nvidia-modprobe -u does)"
    if name == "nouveau":
        _nouveau(store, False)
        return "nouveau unloaded, nvidia loaded"
    if name == "unloaded":
        kmod.load(store)
        return "nvidia loaded"
    if name == "no-firmware":
        _firmware(store, True)
        return "GSP firmware restored"
    if name == "fm-down":
        _fabric_manager(store, True)
        return "fabric manager started: the fabric registers"
    if name == "gpu-lost":
        index = _gpu(gpu)
        with store.mutate() as state:
            if not 0 <= index < len(state.gpus):
                raise UnknownName(f"no GPU {index} on the simulated node", name=index)
            state.gpus[index].lost = False
        return f"GPU {index} reset: it answers again"
    raise UnknownName(f"no driver fault named {name!r}", name=name, hint=f"choose one of: {', '.join(FAULTS)}")
