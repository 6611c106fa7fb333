"""The simulated kernel's side of the driver: the running kernel's release, the nvidia
modules on disk (real ELF ``.ko`` files with a ``.modinfo`` section, as a driver package
installs them), what loading one shows (/sys/module, /proc/driver/nvidia, /proc/devices,
/proc/modules, the kernel log) and what unloading takes away.

Loading reads the module file on disk, so a package that installs another version's
module (the install tests' stand-ins) is what the next load, reboot or ``modprobe``
stand-in brings up, and NVML then reports that version.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

from ..errors import StateError
from ..fileio import ensure_dir
from .files import KERNEL_RELEASE, NodeFiles, mig_minors, release
from . import pcibus
from .pcibus import gpu_information

__all__ = ["KERNEL_RELEASE", "MODULES", "flavour_for", "module_bytes", "write_module_files",
           "module_file", "release", "log", "write_loaded", "remove_loaded", "banner"]

MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset")
MODULE_DIR = "updates/dkms"                  # where DKMS installs the modules it builds
_LICENSES = {"open": "Dual MIT/GPL", "proprietary": "NVIDIA"}


def flavour_for(version: str) -> str:
    """The flavour NVIDIA's driver container picks by branch when asked for none: open from
    R560 (gpu-driver-container, _resolve_kernel_type_from_driver_branch)."""
    return "open" if int(version.split(".")[0]) >= 560 else "proprietary"


def banner(version: str, flavour: str) -> str:
    """/proc/driver/nvidia/version's first line, as each flavour prints it."""
    kind = "Open Kernel Module for x86_64" if flavour == "open" else "x86_64 Kernel Module"
    return f"NVRM version: NVIDIA UNIX {kind}  {version}  Tue Jun  4 08:56:33 UTC 2024"


def module_bytes(fields: dict, *, signed: bool = False) -> bytes:
    """A relocatable ELF64 object with a ``.modinfo`` section: enough for modinfo's fields."""
    modinfo = b"".join(f"{k}={v}".encode() + b"\0" for k, v in fields.items())
    shstrtab = b"\0.modinfo\0.shstrtab\0"
    modinfo_off = 64
    shstr_off = modinfo_off + len(modinfo)
    shoff = (shstr_off + len(shstrtab) + 7) & -8
    header = (b"\x7fELF\x02\x01\x01" + b"\0" * 9
              + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2))
    sections = (b"\0" * 64
                + struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, modinfo_off, len(modinfo), 0, 0, 1, 0)
                + struct.pack("<IIQQQQIIQQ", 10, 3, 0, 0, shstr_off, len(shstrtab), 0, 0, 1, 0))
    body = header + modinfo + shstrtab
    data = body + b"\0" * (shoff - len(body)) + sections
    return data + b"\0" * 16 + b"~Module signature appended~\n" if signed else data


def module_file(root: Path, name: str = "nvidia") -> Path:
    return root / "lib/modules" / release(root) / MODULE_DIR / f"{name}.ko"


def write_module_files(root: Path, version: str, flavour: str, *, signed: bool = False) -> None:
    """The driver's modules for the running kernel and their modules.dep lines, as DKMS
    leaves them after building a driver version."""
    base = ensure_dir(root / "lib/modules" / release(root) / MODULE_DIR)
    for name in MODULES:
        fields = {"version": version, "license": _LICENSES[flavour], "name": name.replace("-", "_")}
        (base / f"{name}.ko").write_bytes(module_bytes(fields, signed=signed))
    dep = base.parent.parent / "modules.dep"
    lines = [f"{MODULE_DIR}/nvidia.ko:"] + [f"{MODULE_DIR}/{n}.ko: {MODULE_DIR}/nvidia.ko" for n in MODULES[1:]]
    dep.write_text("\n".join(lines) + "\n")


def log(root: Path, *messages: str, level: int = 6) -> None:
    """Append records to the simulated /dev/kmsg (``PRIO,SEQ,USEC,FLAGS;MESSAGE``)."""
    path = root / "dev/kmsg"
    try:
        seq = sum(1 for _ in open(path, "rb"))
    except FileNotFoundError:
        seq = 0
    usec = int(time.monotonic() * 1e6)
    with open(path, "a") as f:
        for i, message in enumerate(messages):
            f.write(f"{level},{seq + i},{usec},-;{message}\n")


def write_loaded(w: NodeFiles, facts, state, version: str, flavour: str) -> None:
    """Everything the loaded nvidia, nvidia_uvm and nvidia_modeset modules show."""
    majors = facts.majors
    w.file("proc/devices", "Character devices:\n  1 mem\n  5 /dev/tty\n"
           f"{majors['nvidia']} nvidia-frontend\n{majors['nvidia-uvm']} nvidia-uvm\n"
           f"{majors['nvidia-caps']} nvidia-caps\n\nBlock devices:\n  7 loop\n")
    w.file("proc/modules",
           "nvidia_uvm 1540096 0 - Live 0x0000000000000000 (PO)\n"
           "nvidia_modeset 1314816 0 - Live 0x0000000000000000 (PO)\n"
           "nvidia 56807424 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (PO)\n")
    w.file("proc/driver/nvidia/version",
           f"{banner(version, flavour)}\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n")
    for name, refs in (("nvidia", 2), ("nvidia_uvm", 0), ("nvidia_modeset", 0)):
        w.file(f"sys/module/{name}/version", f"{version}\n")
        w.file(f"sys/module/{name}/refcnt", f"{refs}\n", mode=0o444)
    for gpu in state.gpus:
        if not gpu.on_nvidia:            # another driver holds it (sim/pcibus.py)
            continue
        w.file(f"proc/driver/nvidia/gpus/{gpu.pci_bus_id}/information", gpu_information(facts, gpu, version),
               mode=0o444)
        w.file(f"proc/driver/nvidia/gpus/{gpu.pci_bus_id}/unbindLock", "0\n")
        _bind(w.root, gpu.pci_bus_id, "nvidia")
    for cap, minor in (("config", 1), ("monitor", 2)):
        w.file(f"proc/driver/nvidia/capabilities/mig/{cap}",
               f"DeviceFileMinor: {minor}\nDeviceFileMode: {0o400 if cap == 'config' else 0o444}\n"
               "DeviceFileModify: 1\n", mode=0o444)
    w.file("proc/driver/nvidia-caps/mig-minors",
           "".join(f"{k} {v}\n" for k, v in mig_minors().items()), mode=0o444)


def _bind(root: Path, bus_id: str, driver: str | None) -> None:
    """The PCI device's ``driver`` link, as the kernel sets it when a driver binds it."""
    link = root / f"sys/bus/pci/devices/{bus_id}/driver"
    if link.is_symlink():
        link.unlink()
    if driver:
        ensure_dir(root / f"sys/bus/pci/drivers/{driver}")
        # Relative to the device's own folder (under /sys/devices, where bus/pci/devices links).
        link.symlink_to(os.path.relpath(os.path.realpath(root / f"sys/bus/pci/drivers/{driver}"),
                                        os.path.realpath(link.parent)))


def remove_loaded(root: Path, state, *, bind: str | None = None) -> None:
    """What rmmod of the nvidia modules takes away (device nodes stay: nothing removes them)."""
    for name in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        shutil.rmtree(root / "sys/module" / name, ignore_errors=True)
    for rel in ("proc/driver/nvidia", "proc/driver/nvidia-caps"):
        shutil.rmtree(root / rel, ignore_errors=True)
    for rel in ("proc/modules", "proc/devices"):
        path = root / rel
        if path.exists():
            kept = [line for line in path.read_text().splitlines(keepends=True) if "nvidia" not in line]
            path.write_text("".join(kept))
    for gpu in state.gpus:
        if gpu.on_nvidia:
            _bind(root, gpu.pci_bus_id, bind)


def bind_all(root: Path, state, driver: str | None) -> None:
    """The GPUs the nvidia driver would hold (not those another driver holds) bound to ``driver``."""
    for gpu in state.gpus:
        if gpu.on_nvidia:
            _bind(root, gpu.pci_bus_id, driver)


def read_module(root: Path) -> tuple[str, str]:
    """(version, flavour) of the nvidia module on disk; StateError as modprobe fails without one."""
    from ..driver.modinfo import read_module_info
    path = module_file(root)
    try:
        info = read_module_info(path)
    except OSError:
        info = None
    if info is None or not info.version:
        raise StateError(f"modprobe: FATAL: Module nvidia not found in directory /lib/modules/{release(root)}",
                         where=str(path), hint="install the driver's kernel module first")
    return info.version, info.flavour or "proprietary"


def loaded_version(facts, state) -> str:
    return state.driver.get("module_version") or facts.driver_version


def _blacklisted(root: Path, module: str) -> bool:
    for conf in sorted((root / "etc/modprobe.d").glob("*.conf")):
        try:
            if any(line.split()[:2] == ["blacklist", module] for line in conf.read_text().splitlines()):
                return True
        except OSError:
            continue
    return False


def nouveau_files(root: Path, present: bool) -> None:
    if present:
        ensure_dir(root / "sys/module/nouveau")
        (root / "sys/module/nouveau/refcnt").write_text("1\n")
        with open(root / "proc/modules", "a") as f:
            f.write("nouveau 2875392 1 - Live 0x0000000000000000\n")
    else:
        shutil.rmtree(root / "sys/module/nouveau", ignore_errors=True)
        path = root / "proc/modules"
        if path.exists():
            path.write_text("".join(l for l in path.read_text().splitlines(keepends=True)
                                    if not l.startswith("nouveau ")))


def _nouveau_probe(root: Path, state) -> None:
    """nouveau took the GPUs: the nvidia module's probe never runs (the driver's own message)."""
    bind_all(root, state, "nouveau")
    log(root, f"NVRM: The NVIDIA probe routine was not called for {len(state.gpus)} device(s).",
        "NVRM: This can occur when a driver such as: ", "NVRM: nouveau, rivafb, nvidiafb or rivatv ",
        "NVRM: was loaded and obtained ownership of the NVIDIA device(s).",
        "NVRM: No NVIDIA devices probed.", level=4)


def bring_up(root: Path, facts, state) -> str | None:
    """Load the module on disk into ``state`` (under the store's lock) and write what it
    shows; None when nouveau holds the GPUs. StateError when there is no module."""
    if state.driver.get("nouveau"):
        _nouveau_probe(root, state)
        return None
    version, flavour = read_module(root)
    state.driver_loaded = True
    state.driver["flavour"] = flavour
    # NVML reports the node's driver_version (facts; docs/simulator.md: tests may set it by
    # hand) until a module of another version comes up.
    if version != facts.driver_version:
        state.driver["module_version"] = version
    else:
        state.driver.pop("module_version", None)
    write_loaded(NodeFiles(root, facts.real_device_nodes), facts, state, version, flavour)
    log(root, "nvidia: loading out-of-tree module taints kernel.", f"NVRM: loading {banner(version, flavour)}")
    return version


def load(store) -> str | None:
    """modprobe nvidia: a no-op when loaded; else the module on disk comes up."""
    with store.mutate() as state:
        if state.driver_loaded:
            return loaded_version(store.facts, state)
        version = bring_up(store.root, store.facts, state)
    pcibus.sync(store.root, store.facts, store.read())
    return version


def unload(store) -> None:
    """rmmod nvidia_modeset nvidia_uvm nvidia: refused while processes use GPUs."""
    from .node import SimNvmlError
    with store.mutate() as state:
        if not state.driver_loaded:
            return
        try:
            state.unload_driver(store.facts)
        except SimNvmlError:
            raise StateError("cannot unload the driver: processes use GPUs (rmmod: ERROR: Module nvidia "
                             "is in use)", hint="release them first with 'hostagent sim release'") from None
        remove_loaded(store.root, state)
        log(store.root, "nvidia-uvm: Unloaded the UVM driver.", "nvidia-modeset: Unloading")
    pcibus.sync(store.root, store.facts, store.read())


def boot(root: Path, facts, state) -> None:
    """At boot (under the store's lock, after ``NodeState.reboot``): nouveau comes up first
    unless blacklisted, else the nvidia module on disk."""
    remove_loaded(root, state)
    if state.driver.get("nouveau") and _blacklisted(root, "nouveau"):
        state.driver.pop("nouveau")
        nouveau_files(root, False)
    state.driver_loaded = False
    try:
        bring_up(root, facts, state)
    except StateError:
        pass                    # no module for this kernel: the node boots without one
