"""Generate the files a real GPU host has: device nodes, /proc entries, driver libraries,
firmware, IPC sockets and the driver's helper binaries; keep MIG capability nodes in step
with the simulated instances.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import uuid as uuidlib
from pathlib import Path

from ..fileio import ensure_dir
from . import catalog, driverlibs, kmod, packages, pcibus, pcifiles, topology, unixsock
from .elf import shared_object_bytes
from .files import FIXED_CAP_MINORS, NodeFiles, can_create_device_nodes
from .node import NodeState, SimGpu
from .store import SimStore

__all__ = ["create_node", "upgrade_libraries", "TOOLS", "NVIDIA_MAJOR", "LIB_DIR"]

NVIDIA_MAJOR = 195
LIB_DIR = driverlibs.LIB_DIR
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")

DRIVER_TOOLS = {  # binary -> module[:function] in hostagent.sim.tools
    "nvidia-smi": "nvidia_smi", "nvidia-cuda-mps-control": "mps_control",
    "nvidia-cuda-mps-server": "mps_server", "nvidia-persistenced": "persistenced",
    "modprobe": "modprobe",
}
# The distribution's package tools, by package manager (sim.packages).
PACKAGE_TOOLS = {
    "apt": {"dpkg-query": "apt:dpkg_query", "apt-cache": "apt:apt_cache", "apt-mark": "apt:apt_mark",
            "apt-get": "apt:apt_get"},
    "dnf": {"rpm": "dnf:rpm", "dnf": "dnf:dnf"},
}
TOOLS = {**DRIVER_TOOLS, **PACKAGE_TOOLS["apt"], **PACKAGE_TOOLS["dnf"]}     # every stand-in



def _free_majors(root_proc_devices: str = "/proc/devices", count: int = 2) -> list[int]:
    """Dynamic majors for nvidia-uvm and nvidia-caps that this host does not use."""
    try:
        used = {int(line.split()[0]) for line in open(root_proc_devices)
                if line.strip() and line.split()[0].isdigit()}
    except OSError:
        used = set()
    return [m for m in range(511, 384, -1) if m not in used][:count]


def _gpu_identity(profile: str, bus_id: str) -> tuple[str, str]:
    uuid = f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'hostagent-sim/{profile}/{bus_id}')}"
    serial = str(int(hashlib.sha256(uuid.encode()).hexdigest(), 16))[:13]
    return uuid, serial


def create_node(root: str | os.PathLike, profile_name: str, *, real_nodes: bool | None = None,
                dynamic_majors: tuple[int, int] | None = None,
                driver_version: str | None = None, distro: str | None = packages.DEFAULT_DISTRO) -> SimStore:
    """Build a simulated node of ``profile_name`` under ``root`` and return its store.

    ``distro`` (``sim.packages.DISTROS``) gives the node its /etc/os-release and the package
    tools of that distribution with the driver's packages installed, so the driver installer
    works on it; a root that already has an /etc/os-release (a real system's, built for
    tests) keeps its own distribution and tools.

    ``driver_version`` installs another driver than the profile's: its files carry that
    version, and NVML answers as that branch does (figures and MIG profiles that differ by
    branch, the CUDA version it ships: see ``catalog.sku_from_dict``).

    Device nodes are real character devices when this process may create them
    (``real_nodes`` decides otherwise), regular files if not. ``dynamic_majors`` fixes the (nvidia-uvm, nvidia-caps) majors; by default they are
    chosen among majors this host does not use, so a container given these nodes can
    never reach a real device.
    """
    profile = catalog.load_profile(profile_name)
    root = ensure_dir(Path(root).absolute())
    if real_nodes is None:
        real_nodes = can_create_device_nodes(root)
    w = NodeFiles(root, real_nodes)
    uvm_major, caps_major = dynamic_majors or _free_majors()
    vfio_majors = [m for m in _free_majors(count=5) if m not in (uvm_major, caps_major)][:3]
    version = catalog.check_driver_version(driver_version) if driver_version else profile.driver_version
    cuda = catalog.cuda_version(version) if driver_version else profile.cuda_driver_version

    gpus = []
    for index, slot in enumerate(profile.gpus):
        uuid, serial = _gpu_identity(profile.name, slot.pci_bus_id)
        gpus.append(SimGpu(index=index, sku=slot.sku.key, uuid=uuid, pci_bus_id=slot.pci_bus_id,
                           minor=profile.minor(index), serial=serial,
                           gi_ids="shuffled" if index % 2 else "placement"))
    used_skus = {g.sku for g in gpus}
    facts_raw = {"profile": profile.name, "driver_version": version, "cuda_driver_version": cuda,
                 "real_device_nodes": real_nodes, "nvswitches": profile.nvswitches,
                 "majors": {"nvidia": NVIDIA_MAJOR, "nvidia-uvm": uvm_major, "nvidia-caps": caps_major,
                            **dict(zip(("vfio", "vfio-dev", "vfio-misc"), vfio_majors))},
                 "skus": {k: v for k, v in catalog.raw_skus().items() if k in used_skus},
                 **pcifiles.functions_and_groups(profile)}
    model = None
    if profile.topology:
        facts_raw["topology"] = topology.resolve(profile.topology, [g.pci_bus_id for g in gpus],
                                                 [slot.sku for slot in profile.gpus])
        model = topology.SimTopology.from_dict(facts_raw["topology"])

    # /dev
    for gpu in gpus:
        w.chardev(f"dev/nvidia{gpu.minor}", NVIDIA_MAJOR, gpu.minor)
    w.chardev("dev/nvidiactl", NVIDIA_MAJOR, 255)
    w.chardev("dev/nvidia-modeset", NVIDIA_MAJOR, 254)
    w.chardev("dev/nvidia-uvm", uvm_major, 0)
    w.chardev("dev/nvidia-uvm-tools", uvm_major, 1)
    ensure_dir(root / "dev/nvidia-caps")
    for minor, mode in FIXED_CAP_MINORS.items():
        w.chardev(f"dev/nvidia-caps/nvidia-cap{minor}", caps_major, minor, mode)

    # /sys (the module's own files and /proc/driver come with loading it: sim/kmod.py)
    w.file("proc/sys/kernel/osrelease", f"{kmod.KERNEL_RELEASE}\n", mode=0o444)
    w.file("sys/class/dmi/id/product_name", f"{profile.machine}\n", mode=0o444)
    folders = topology.sysfs_paths(model) if model else {}
    for gpu in gpus:
        sku = catalog.skus()[gpu.sku]
        pci = f"sys/bus/pci/devices/{gpu.pci_bus_id}"
        if gpu.pci_bus_id in folders:      # the kernel's device folder, nested under its bridges
            ensure_dir(root / "sys/devices" / folders[gpu.pci_bus_id])
            w.link(pci, f"../../../devices/{folders[gpu.pci_bus_id]}")
            w.file(f"{pci}/local_cpulist", f"{topology.cpu_text(model.gpu_cpus(gpu.index))}\n", mode=0o444)
        w.file(f"{pci}/vendor", "0x10de\n", mode=0o444)
        w.file(f"{pci}/device", f"0x{sku.pci_device_id >> 16:04x}\n", mode=0o444)
        w.file(f"{pci}/class", "0x030200\n", mode=0o444)  # 3D controller
        w.file(f"{pci}/numa_node", f"{profile.numa_node(gpu.index)}\n", mode=0o444)
        w.file(f"{pci}/resource", pcifiles.resource_text(sku.memory_mib), mode=0o444)
    pcifiles.write_functions(w, facts_raw["functions"], folders)
    pcifiles.write_pci_ids(w, profile)
    w.file(str(pcibus.vfio_module_file(root).relative_to(root)), b"\0" * 64)
    # NVSwitches: one entry each, as the nvidia-nvswitch module lists them.
    for n in range(profile.nvswitches):
        w.file(f"proc/driver/nvidia-nvswitch/devices/0000:{0xc0 + n:02x}:00.0", "", mode=0o444)

    # Driver libraries, firmware, config files, IPC.
    _install_libraries(w, version)
    for name in FIRMWARE:
        w.file(f"lib/firmware/nvidia/{version}/{name}", b"\0" * 64)
    kmod.write_module_files(root, version, kmod.flavour_for(version))
    for rel, content in driverlibs.config_files(catalog.driver_branch(version)).items():
        w.file(rel, content)
    ensure_dir(root / "run/nvidia-persistenced")
    _unix_socket(root / "run/nvidia-persistenced/socket")
    ensure_dir(root / "tmp/nvidia-mps")
    for tool, module in DRIVER_TOOLS.items():
        w.file(f"usr/bin/{tool}", _tool_script(root, module), mode=0o755)

    store = SimStore(root)
    store.initialise(facts_raw, NodeState(gpus=gpus))
    if distro is not None and not (root / "etc/os-release").exists():
        _distribution(root, distro, version)
    with store.mutate() as state:      # the driver loads at boot
        kmod.bring_up(root, store.facts, state)
    pcibus.sync(root, store.facts, store.read())
    return store


def _install_libraries(w: NodeFiles, version: str) -> None:
    """Every library of the driver's branch with its SONAME and development links, the
    32-bit copies, and GBM's backend link to the allocator."""
    for lib in driverlibs.libraries(catalog.driver_branch(version)):
        for base, machine in ((driverlibs.LIB_DIR, "x86_64"), (driverlibs.LIB32_DIR, "i386")):
            if machine == "i386" and not lib.lib32:
                continue
            folder = f"{base}/{lib.folder}".rstrip("/")
            real, soname = lib.file(version), lib.soname_of(version)
            w.file(f"{folder}/{real}", shared_object_bytes(soname, machine=machine), mode=0o755)
            if soname != real:
                w.link(f"{folder}/{soname}", real)
            if lib.dev_link:
                w.link(f"{folder}/{lib.stem}.so", soname)
    w.link(f"{driverlibs.LIB_DIR}/gbm/nvidia-drm_gbm.so", "../libnvidia-allocator.so.1")


def upgrade_libraries(root: Path, real_nodes: bool, old: str, new: str) -> None:
    """What upgrading the driver's packages does to its libraries: the ``old`` version's
    files go, in every folder, and the ``new`` branch's are installed with their links (the
    links move to them). Libraries with versions of their own stay."""
    for lib in driverlibs.libraries(catalog.driver_branch(old)):
        if lib.version:
            continue
        for base in (driverlibs.LIB_DIR, driverlibs.LIB32_DIR):
            path = root / base / lib.folder / lib.file(old)
            if path.is_file():
                path.unlink()
    _install_libraries(NodeFiles(root, real_nodes), new)


def _unix_socket(path: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        unixsock.bind(s, path)     # a deep root makes the path too long for sun_path
    finally:
        s.close()


def _distribution(root: Path, name: str, version: str) -> None:
    """/etc/os-release, the package tools, and the driver's packages as installed."""
    distro = packages.write_distro(root, name)
    manager = "dnf" if distro.family == "rhel" else "apt"
    for tool, spec in PACKAGE_TOOLS[manager].items():
        NodeFiles(root, False).file(f"usr/bin/{tool}", _tool_script(root, spec), mode=0o755)
    packages.PackageDb(packages.initial_packages(distro, version, kmod.flavour_for(version)), set()).save(root)


def _tool_script(root: Path, spec: str) -> str:
    package_parent = Path(__file__).resolve().parents[2]
    module, _, function = spec.partition(":")
    return (f"#!{sys.executable} -I\n"
            "# Stand-in for the tool of this name, backed by the simulated node.\n"
            "import sys\n"
            f"sys.path.insert(0, {str(package_parent)!r})\n"
            f"from hostagent.sim.tools import {module}\n"
            f"sys.exit({module}.{function or 'main'}({str(root)!r}, sys.argv[1:]))\n")


