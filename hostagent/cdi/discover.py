"""Find what a container needs from the host, as ``Edits``. Discoverers read host files
through the HostRoot and know nothing about CDI's format.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..devices import Gpu, MigDevice
from ..driver import nvcaps
from ..driver.elf import read_soname
from ..errors import HostagentError, NotFoundError
from ..hostroot import LIBRARY_DIRS, HostRoot
from .edits import IPC_MOUNT_OPTIONS, LIBRARY_MOUNT_OPTIONS, DeviceNode, Edits, Mount

__all__ = ["Discovery", "MissingDeviceNode", "device_node"]

BINARY_DIRS = ("usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin", "bin", "sbin")
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl", "nvidia-xconfig")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
IPC_SOCKETS = ("run/nvidia-persistenced/socket", "var/run/nvidia-persistenced/socket",
               "run/nvidia-fabricmanager/socket", "var/run/nvidia-fabricmanager/socket")
# Graphics and compute config files, as the reference generator mounts them: where the
# driver may install them (under any of CONFIG_ROOTS) -> container path.
_EGL_EXTERNAL = ("15_nvidia_gbm", "10_nvidia_wayland", "09_nvidia_wayland2", "20_nvidia_xcb", "20_nvidia_xlib")
CONFIG_FILES = {
    "glvnd/egl_vendor.d/10_nvidia.json": "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    **{f"egl/egl_external_platform.d/{n}.json": f"/usr/share/egl/egl_external_platform.d/{n}.json"
       for n in _EGL_EXTERNAL},
    "nvidia/nvoptix.bin": "/usr/share/nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf": "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf": "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
    "vulkan/icd.d/nvidia_icd.json": "/etc/vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json": "/etc/vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json": "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
    **{f"vulkan/icd.d/nvidia_icd.{arch}.json": f"/etc/vulkan/icd.d/nvidia_icd.{arch}.json"
       for arch in ("x86_64", "aarch64")},
    "OpenCL/vendors/nvidia.icd": "/etc/OpenCL/vendors/nvidia.icd",
}
CONFIG_ROOTS = ("etc", "usr/share", "usr/local/share")
# The EGL external platform libraries the files above name (libnvidia-egl-gbm.so.1, ...).
# They carry versions of their own (libnvidia-egl-wayland.so.1.1.13), not the driver's, so
# the ``lib*.so.<driver version>`` search misses them; the reference generator looks them
# up as ``libnvidia-egl-<platform>.so.*.*`` (nvidia-container-toolkit
# internal/discover/graphics.go; its generate log: "Selecting
# /usr/lib/x86_64-linux-gnu/libnvidia-egl-gbm.so.1.1.2 as ..."), with GBM's backend link
# gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1.
EGL_PLATFORM_LIBRARIES = tuple(f"libnvidia-egl-{p}" for p in ("gbm", "wayland", "wayland2", "xcb", "xlib"))
GBM_BACKEND = "gbm/nvidia-drm_gbm.so"


class MissingDeviceNode(NotFoundError):
    code = "missing_device_node"


class DriverFilesMissing(NotFoundError):
    code = "driver_files_missing"


def device_node(host: HostRoot, container_path: str, *, required: bool = True) -> DeviceNode | None:
    """The character device at ``container_path`` (``/dev/...``), read from the host's dev
    root (its numbers as the host's platform gives them: a simulated node's records where a
    normal user made it)."""
    host_path = host.dev(container_path.removeprefix("/dev/"))
    try:
        found = host.platform.char_device(host, host_path)
    except FileNotFoundError:
        if required:
            raise MissingDeviceNode(f"device node {container_path} does not exist",
                                    where=str(host_path)) from None
        return None
    if found is None:
        if required:
            raise MissingDeviceNode(f"{container_path} is not a character device",
                                    where=str(host_path)) from None
        return None
    return DeviceNode(path=container_path, host_path=host.on_host(host_path), major=found.major,
                      minor=found.minor, file_mode=found.mode)


@dataclass
class Discovery:
    """One generation's view of the host; caches the driver's tables it reads."""
    host: HostRoot
    driver_version: str
    _mig_minors: dict | HostagentError | None = field(default=None, repr=False)

    # ---- device nodes --------------------------------------------------------------

    def node(self, container_path: str, *, required: bool = True) -> DeviceNode | None:
        """The character device at ``container_path`` (e.g. /dev/nvidia0), read from the host."""
        return device_node(self.host, container_path, required=required)

    def control_nodes(self) -> Edits:
        nodes = (self.node(f"/dev/{name}", required=False) for name in CONTROL_NODES)
        return Edits(device_nodes=tuple(n for n in nodes if n))

    def gpu(self, gpu: Gpu) -> Edits:
        nodes = [self.node(f"/dev/nvidia{gpu.minor}")]
        links = []
        drm = self.host.sys(f"bus/pci/devices/{gpu.sysfs_bus_id}/drm")
        for entry in sorted(drm.glob("card*")) + sorted(drm.glob("renderD*")):
            node = self.node(f"/dev/dri/{entry.name}", required=False)
            if node:
                nodes.append(node)
                kind = "card" if entry.name.startswith("card") else "render"
                links.append((f"../{entry.name}", f"/dev/dri/by-path/pci-{gpu.sysfs_bus_id}-{kind}"))
        return Edits(device_nodes=tuple(nodes), device_links=tuple(links))

    def mig_device(self, dev: MigDevice) -> Edits:
        """Parent node plus the GI and CI access capabilities; a missing one is an error."""
        if self._mig_minors is None:
            try:
                self._mig_minors = nvcaps.read_mig_minors(self.host)
            except HostagentError as e:          # every MIG device fails, each reported
                self._mig_minors = e
        if isinstance(self._mig_minors, HostagentError):
            e = self._mig_minors
            raise MissingDeviceNode(f"its capability minors are unknown: {e.what}", where=e.where, hint=e.hint)
        nodes = [self.node(f"/dev/nvidia{dev.parent_minor}")]
        for cap in (nvcaps.gi_cap(dev.parent_minor, dev.gi), nvcaps.ci_cap(dev.parent_minor, dev.gi, dev.ci)):
            minor = self._mig_minors.get(cap)
            if minor is None:
                raise MissingDeviceNode(f"the driver lists no capability {cap}",
                                        where=str(self.host.proc("driver/nvidia-caps/mig-minors")))
            try:
                nodes.append(self.node(f"/dev/nvidia-caps/nvidia-cap{minor}"))
            except MissingDeviceNode as e:
                raise MissingDeviceNode(f"capability node for {cap} is missing", where=e.where,
                                        hint="create it with 'hostagent mig apply' or 'nvidia-smi', "
                                             "which make the nodes for new MIG instances") from None
        return Edits(device_nodes=tuple(nodes))

    # ---- driver files --------------------------------------------------------------

    def _container_path(self, host_file: Path) -> str:
        return "/" + host_file.relative_to(self.host.driver()).as_posix()

    def _mount(self, path: Path, container_path: str, options=LIBRARY_MOUNT_OPTIONS) -> Mount:
        """A mount of ``path`` (on this machine) by the path the host's engines know it by."""
        return Mount(self.host.on_host(path), container_path, options)

    def libraries(self) -> Edits:
        """Every ``lib*.so.<driver version>`` and EGL platform library, their SONAME and
        ``.so`` links that exist on the host, GBM's backend link, and the folders whose
        linker cache must be refreshed."""
        mounts, links, folders = [], [], []
        seen: set[Path] = set()
        suffix = f".so.{self.driver_version}"
        for rel in LIBRARY_DIRS:
            for folder in (self.host.driver(rel), self.host.driver(rel) / "vdpau"):
                if not folder.is_dir() or self.host.resolve(folder) in seen:
                    continue
                seen.add(self.host.resolve(folder))
                libs = sorted(p for p in folder.glob(f"lib*{suffix}") if p.is_file())
                if not libs:
                    continue
                libs += sorted(p for stem in EGL_PLATFORM_LIBRARIES for p in folder.glob(f"{stem}.so.*.*")
                               if p.is_file() and not p.is_symlink())
                cfolder = self._container_path(folder)
                folders.append(cfolder)
                for lib in libs:
                    mounts.append(self._mount(self.host.resolve(lib), self._container_path(lib)))
                    links += self._library_links(folder, cfolder, lib)
                if (folder / GBM_BACKEND).is_symlink():
                    target = os.readlink(folder / GBM_BACKEND)   # ../libnvidia-allocator.so.1
                    if os.path.isabs(target):                    # a host path: the same library, beside
                        target = f"../{os.path.basename(target)}"
                    links.append((target, f"{cfolder}/{GBM_BACKEND}"))
        if not mounts:
            raise DriverFilesMissing(
                f"no driver library (lib*{suffix}) in any of the driver's library folders",
                where=str(self.host.driver()),
                hint=f"searched {', '.join(LIBRARY_DIRS)} and their vdpau folders under it; pass the "
                     "directory the NVIDIA driver is installed under as --driver-root (default: the host root)")
        return Edits(mounts=tuple(mounts), links=tuple(links), folders=tuple(folders))

    @staticmethod
    def _library_links(folder: Path, cfolder: str, lib: Path) -> list[tuple[str, str]]:
        out = []
        soname = read_soname(lib)
        if soname and soname != lib.name and (folder / soname).is_symlink():
            out.append((lib.name, f"{cfolder}/{soname}"))
        stem = lib.name.split(".so.", 1)[0]
        dev_link = folder / f"{stem}.so"
        if stem == "libcuda":
            out.append(("libcuda.so.1", f"{cfolder}/libcuda.so"))     # CUDA's loader wants it
        elif dev_link.is_symlink() and soname:
            out.append((os.readlink(dev_link), f"{cfolder}/{stem}.so"))
        return out

    def binaries(self) -> Edits:
        mounts = []
        for name in BINARIES:
            for rel in BINARY_DIRS:
                path = self.host.resolve(self.host.driver(rel) / name)
                if path.is_file():
                    mounts.append(self._mount(path, f"/usr/bin/{name}"))
                    break
        return Edits(mounts=tuple(mounts))

    def ipc(self) -> Edits:
        mounts, seen = [], set()
        for rel in IPC_SOCKETS:
            path = self.host.host(rel)
            try:
                if not stat.S_ISSOCK(os.stat(path).st_mode) or self.host.resolve(path) in seen:
                    continue
            except OSError:
                continue
            seen.add(self.host.resolve(path))
            mounts.append(self._mount(path, "/" + rel.removeprefix("var/"), IPC_MOUNT_OPTIONS))
        return Edits(mounts=tuple(mounts))

    def firmware(self) -> Edits:
        """The GSP firmware of this driver version, where the kernel looks for it: first the
        folder its firmware_class.path names (a host path: the GPU operator's driver
        container sets /run/nvidia/driver/lib/firmware), then the driver root's."""
        release = os.uname().release
        dirs = []
        custom = self.host.sys("module/firmware_class/parameters/path")
        if custom.is_file() and custom.read_text().strip():
            dirs.append(self.host.host(custom.read_text().strip()))
        dirs += [self.host.driver(d) for d in (f"/lib/firmware/updates/{release}", "/lib/firmware/updates",
                                               f"/lib/firmware/{release}", "/lib/firmware")]
        for d in dirs:
            found = sorted(d.glob(f"nvidia/{self.driver_version}/gsp*.bin"))
            if found:
                return Edits(mounts=tuple(self._mount(p, self._firmware_path(d, p)) for p in found))
        return Edits()

    def _firmware_path(self, folder: Path, path: Path) -> str:
        try:
            return self._container_path(path)
        except ValueError:                 # a firmware folder outside the driver root
            return "/lib/firmware/" + path.relative_to(folder).as_posix()

    def config_files(self) -> Edits:
        mounts = []
        for rel, container_path in CONFIG_FILES.items():
            # Vulkan's files also sit directly under the driver root in some layouts (GKE).
            for root in CONFIG_ROOTS + (("",) if rel.startswith("vulkan/") else ()):
                path = self.host.driver(root) / rel
                if self.host.resolve(path).is_file():
                    mounts.append(self._mount(path, container_path))
                    break
        return Edits(mounts=tuple(mounts))
