"""Read the node's GPUs through pynvml into an Inventory: the one place NVML handles live.

NVML errors are translated here, at the boundary: a missing library or driver becomes a
clear hostagent error, a GPU that cannot be read becomes an ``UnreadableGpu`` record so the
rest of the node is still reported. What NVML keeps from an unprivileged caller on a
MIG-enabled GPU (its memory, instance listings and placements: nvml.h "Requires privileged
user") is left out of the GPU's record and named in ``Inventory.unread``; its MIG devices
are still read, by index, as the MIG device handles need no privilege.
"""

from __future__ import annotations

import contextlib
import math

import pynvml as N

from ..errors import DriverNotLoaded, NvmlError, NvmlLibraryMissing
from ..hostroot import HostRoot
from .records import (ComputeInstance, Gpu, GpuInstance, Inventory, MigDevice, MigProfile,
                      MigState, Placement, Unread, UnreadableGpu, sysfs_bus_id)
from .topology import pcie_root, read_topology

__all__ = ["nvml_session", "read_inventory", "mig_profile_name", "load_nvml"]

ARCHITECTURES = {N.NVML_DEVICE_ARCH_KEPLER: "kepler", N.NVML_DEVICE_ARCH_MAXWELL: "maxwell",
                 N.NVML_DEVICE_ARCH_PASCAL: "pascal", N.NVML_DEVICE_ARCH_VOLTA: "volta",
                 N.NVML_DEVICE_ARCH_TURING: "turing", N.NVML_DEVICE_ARCH_AMPERE: "ampere",
                 N.NVML_DEVICE_ARCH_ADA: "ada", N.NVML_DEVICE_ARCH_HOPPER: "hopper",
                 N.NVML_DEVICE_ARCH_BLACKWELL: "blackwell"}

# nvmlBrandType_t as NVIDIA's go-nvlib names a brand (GetBrandAsString), which NVIDIA's DRA
# driver publishes as a GPU's "brand".
BRANDS = {N.NVML_BRAND_UNKNOWN: "Unknown", N.NVML_BRAND_QUADRO: "Quadro", N.NVML_BRAND_TESLA: "Tesla",
          N.NVML_BRAND_NVS: "NVS", N.NVML_BRAND_GRID: "Grid", N.NVML_BRAND_GEFORCE: "GeForce",
          N.NVML_BRAND_TITAN: "Titan", N.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
          N.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC", N.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
          N.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS", N.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
          N.NVML_BRAND_QUADRO_RTX: "QuadroRTX", N.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
          N.NVML_BRAND_NVIDIA: "Nvidia", N.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
          N.NVML_BRAND_TITAN_RTX: "TitanRTX"}

# Profile-name suffixes by NVML_GPU_INSTANCE_PROFILE_* value (REV1 = +me, ALL_ME, NO_ME, GFX).
_ATTRS = {7: "+me", 8: "+me", 15: "+me.all", 16: "+me.all", 13: "-me", 14: "-me",
          10: "+gfx", 11: "+gfx", 12: "+gfx", 17: "+gfx"}
_SKIP_PROFILE = (N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_INVALID_ARGUMENT)
_NOT_APPLICABLE = 0xFFFFFFFF

def load_nvml(host: HostRoot) -> None:
    """Make pynvml use this host's NVML: its platform's (a simulated node's), the host's
    library under its root or driver root, or (on this machine's own root) the one pynvml
    finds."""
    from .nvmllib import load_host_library, own_library
    if not host.platform.load_nvml(host) and own_library(host):
        load_host_library(host)


@contextlib.contextmanager
def nvml_session(host: HostRoot):
    """nvmlInit/nvmlShutdown around a block, with NVML's start-up errors made actionable."""
    from .nvmllib import SONAME, library_path, own_library
    try:
        load_nvml(host)
        N.nvmlInit()
    except N.NVMLError as e:
        elsewhere = not host.simulated and own_library(host)
        if e.value == N.NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NvmlLibraryMissing(
                f"the NVML library {SONAME} could not be loaded",
                where=str(library_path(host) or host.driver()) if elsewhere else None,
                hint="install the NVIDIA driver's user-space libraries, " +
                     ("or name the root they are installed under with --driver-root"
                      if elsewhere else "or pass --simulate DIR to use a simulated node"),
                nvml_code=e.value) from None
        if e.value == N.NVML_ERROR_FUNCTION_NOT_FOUND and elsewhere:
            raise NvmlLibraryMissing(f"{SONAME} has no nvmlInit_v2: it is not NVIDIA's NVML library",
                                     where=str(library_path(host)), nvml_code=e.value,
                                     hint="check the driver root holds the NVIDIA driver's libraries") from None
        if e.value == N.NVML_ERROR_DRIVER_NOT_LOADED:
            raise DriverNotLoaded(
                "NVML is installed but the NVIDIA kernel driver is not loaded",
                hint="load it with 'modprobe nvidia'; 'hostagent driver verify' says what stops it",
                nvml_code=e.value) from None
        if e.value == N.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            raise NvmlError(
                "Driver/library version mismatch: the NVIDIA libraries and the loaded kernel module "
                "differ", hint="'hostagent driver verify' names both versions and the fix (often a "
                "reboot)", nvml_code=e.value) from None
        if e.value == N.NVML_ERROR_NO_PERMISSION:
            raise NvmlError("no permission to open the NVIDIA devices",
                            hint="run as root or as a member of the group owning /dev/nvidiactl",
                            nvml_code=e.value) from None
        raise NvmlError(f"nvmlInit failed: {e}", nvml_code=e.value) from None
    try:
        yield
    finally:
        try:
            N.nvmlShutdown()
        except N.NVMLError:
            pass


def mig_memory_gb(device_memory_mib: int, profile_memory_mib: int) -> int:
    """The GB figure of a profile name: its share of memory in eighths, of the rounded total."""
    fraction = math.ceil(profile_memory_mib / device_memory_mib * 8) / 8
    return math.floor(fraction * math.ceil(device_memory_mib / 1024) + 0.5)


def mig_profile_name(profile_index: int, slices: int, memory_gb: int) -> str:
    return f"{slices}g.{memory_gb}gb{_ATTRS.get(profile_index, '')}"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Refusals:
    """Facts NVML refused with NO_PERMISSION while reading one GPU (see ``Unread``)."""

    def __init__(self, index: int):
        self.index = index
        self.found: list[Unread] = []

    def ask(self, what: str, call, *args, default=None):
        """``call(*args)``, or ``default`` (noting ``what``) if NVML refuses this process."""
        try:
            return call(*args)
        except N.NVMLError as e:
            if e.value != N.NVML_ERROR_NO_PERMISSION:
                raise
            if what not in {u.what for u in self.found}:
                self.found.append(Unread(gpu=self.index, what=what, error=str(e)))
            return default


def read_inventory(host: HostRoot) -> Inventory:
    """Read every GPU and MIG device once; returns immutable records."""
    with nvml_session(host):
        cuda = N.nvmlSystemGetCudaDriverVersion()
        gpus, unreadable, unread = [], [], []
        for index in range(N.nvmlDeviceGetCount()):
            refusals = _Refusals(index)
            try:
                gpus.append(_read_gpu(host, index, refusals))
                unread += refusals.found
            except N.NVMLError as e:
                unreadable.append(UnreadableGpu(index=index, error=str(e), nvml_code=e.value))
        topology = read_topology([(g, N.nvmlDeviceGetHandleByIndex(g.index)) for g in gpus])
        return Inventory(
            driver_version=_text(N.nvmlSystemGetDriverVersion()),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
            nvml_version=_text(N.nvmlSystemGetNVMLVersion()),
            gpus=tuple(gpus), unreadable=tuple(unreadable), unread=tuple(unread),
            simulated=host.simulated, topology=topology,
            device_nodes=_device_node_kind(host),
            paths={"root": str(host.root), "driver_root": str(host.driver()),
                   "dev_root": str(host.dev()), "cdi_dir": str(host.cdi_dir),
                   "state_dir": str(host.state_dir)})


def _device_node_kind(host: HostRoot) -> str:
    import stat
    try:
        mode = host.dev("nvidiactl").stat().st_mode
    except OSError:
        return "missing"
    return "char" if stat.S_ISCHR(mode) else "regular-files"


def _numa_node(host: HostRoot, nvml_bus_id: str) -> int | None:
    """The GPU's NUMA node as the kernel reports it (what the device plugin reads for
    topology); None where it reports none: -1, as on single-node or firmware without
    affinity information, or no file."""
    try:
        text = host.sys(f"bus/pci/devices/{sysfs_bus_id(nvml_bus_id)}/numa_node").read_text()
        node = int(text.strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _read_gpu(host: HostRoot, index: int, refusals: _Refusals) -> Gpu:
    h = N.nvmlDeviceGetHandleByIndex(index)
    memory = refusals.ask("memory", N.nvmlDeviceGetMemoryInfo, h)   # aggregate, on MIG
    memory_mib = None if memory is None else memory.total >> 20
    pci = N.nvmlDeviceGetPciInfo_v3(h)
    major, minor = N.nvmlDeviceGetCudaComputeCapability(h)
    try:
        serial = _text(N.nvmlDeviceGetSerial(h))
    except N.NVMLError_NotSupported:
        serial = None
    uuid = _text(N.nvmlDeviceGetUUID(h))
    gpu_minor = N.nvmlDeviceGetMinorNumber(h)
    bus_id = _text(pci.busId)
    return Gpu(index=index, minor=gpu_minor, uuid=uuid, name=_text(N.nvmlDeviceGetName(h)),
               serial=serial, memory_mib=memory_mib, pci_bus_id=bus_id,
               numa_node=_numa_node(host, bus_id), pcie_root=pcie_root(host, bus_id),
               pci_device_id=pci.pciDeviceId, pci_subsystem_id=pci.pciSubSystemId,
               compute_capability=f"{major}.{minor}",
               architecture=ARCHITECTURES.get(N.nvmlDeviceGetArchitecture(h), "unknown"),
               brand=_brand(h),
               mig=_read_mig(h, index, uuid, gpu_minor, memory_mib, refusals))


def _brand(h) -> str | None:
    try:
        value = N.nvmlDeviceGetBrand(h)
    except (N.NVMLError_NotSupported, N.NVMLError_FunctionNotFound):
        return None
    return BRANDS.get(value, f"Unknown({value})")


def _read_mig(h, index: int, uuid: str, gpu_minor: int, memory_mib: int | None,
              refusals: _Refusals) -> MigState | None:
    try:
        current, pending = N.nvmlDeviceGetMigMode(h)
    except N.NVMLError_NotSupported:
        return None
    enabled = current == N.NVML_DEVICE_MIG_ENABLE
    profiles = _read_profiles(h, enabled, memory_mib, refusals)
    if not enabled:
        return MigState(enabled=False, pending=pending == N.NVML_DEVICE_MIG_ENABLE, profiles=profiles)
    gis = refusals.ask("gpu instances", _read_gpu_instances, h, profiles)
    devices = _read_mig_devices(h, index, uuid, gpu_minor, gis, profiles)
    return MigState(enabled=True, pending=pending == N.NVML_DEVICE_MIG_ENABLE,
                    profiles=profiles, gpu_instances=gis or (), devices=devices)


def _read_profiles(h, enabled: bool, memory_mib: int | None, refusals: _Refusals) -> tuple[MigProfile, ...]:
    out = []
    for idx in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            # The versioned call needs MIG enabled; the v1 struct answers either way.
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, idx, version=2 if enabled else 1)
        except N.NVMLError as e:
            if e.value in _SKIP_PROFILE:
                continue
            raise
        if memory_mib is not None:
            name = mig_profile_name(idx, info.sliceCount, mig_memory_gb(memory_mib, info.memorySizeMB))
        else:   # the GPU's memory refused (only ever with MIG enabled): NVML's own v2 name
            name = _text(info.name).removeprefix("MIG ")
        out.append(MigProfile(
            index=idx, id=info.id, name=name,
            slices=info.sliceCount, instances=info.instanceCount, memory_mib=info.memorySizeMB,
            multiprocessors=info.multiprocessorCount, copy_engines=info.copyEngineCount,
            decoders=info.decoderCount, encoders=info.encoderCount, jpegs=info.jpegCount,
            ofas=info.ofaCount, placements=refusals.ask("placements", _gi_placements, h, info.id,
                                                        default=())))
    return tuple(sorted(out, key=lambda p: (p.slices, p.memory_mib, p.name)))


def _gi_placements(h, profile_id: int) -> tuple[Placement, ...]:
    count = N.c_uint(0)
    N.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, N.byref(count))
    array = (N.c_nvmlGpuInstancePlacement_t * count.value)()
    N.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, array, N.byref(count))
    return tuple(Placement(p.start, p.size) for p in array[:count.value])


def _read_gpu_instances(h, profiles) -> tuple[GpuInstance, ...]:
    # NVML fills a buffer the caller sizes from the profile's instanceCount and never learns
    # its size (*count is output only). A30's instanceCount values are wrong (mig-parted
    # hardcodes its profiles for that): one too small would have NVML write past the buffer.
    # A profile's instances never share a memory slice, so the GPU's memory slices bound
    # them whatever NVML reports.
    memory_slices = max((pl.start + pl.size for prof in profiles for pl in prof.placements), default=0)
    out = []
    for prof in profiles:
        count = N.c_uint(0)
        array = (N.c_nvmlGpuInstance_t * max(prof.instances, memory_slices))()
        N.nvmlDeviceGetGpuInstances(h, prof.id, array, N.byref(count))
        for gi in array[:count.value]:
            info = N.nvmlGpuInstanceGetInfo(gi)
            out.append(GpuInstance(
                id=info.id, profile_id=info.profileId, profile=prof.name,
                placement=Placement(info.placement.start, info.placement.size),
                compute_instances=_read_compute_instances(gi, prof.slices)))
    return tuple(sorted(out, key=lambda g: g.id))


# Compute slices of each NVML_COMPUTE_INSTANCE_PROFILE_* value (1, 2, 3, 4, 7, 8, 6, 1 REV1, 7 NVL).
_CI_SLICES = (1, 2, 3, 4, 7, 8, 6, 1, 7)


def _profile_of(attrs, profiles) -> MigProfile | None:
    """The GPU-instance profile of a MIG device known only by its attributes: same compute
    slices, then the most engine counts in common, then the nearest memory (a device's
    memory need not equal its profile's: the MIG user guide shows two 3g.20gb devices of
    20224 and 20096 MiB)."""
    engines = (attrs.sharedCopyEngineCount, attrs.sharedDecoderCount, attrs.sharedEncoderCount,
               attrs.sharedJpegCount, attrs.sharedOfaCount)
    same = [p for p in profiles if p.slices == attrs.gpuInstanceSliceCount]
    return min(same, default=None, key=lambda p: (
        -sum(a == b for a, b in zip(engines, (p.copy_engines, p.decoders, p.encoders, p.jpegs, p.ofas))),
        abs(p.memory_mib - attrs.memorySizeMB)))


def _read_compute_instances(gi, gi_slices: int) -> tuple[ComputeInstance, ...]:
    out = []
    for idx in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        if idx < len(_CI_SLICES) and _CI_SLICES[idx] > gi_slices:
            continue   # cannot fit: skip a call the driver would answer NOT_SUPPORTED
        try:
            prof = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, idx, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except N.NVMLError as e:
            if e.value in _SKIP_PROFILE:
                continue
            raise
        count = N.c_uint(0)
        array = (N.c_nvmlComputeInstance_t * prof.instanceCount)()
        N.nvmlGpuInstanceGetComputeInstances(gi, prof.id, array, N.byref(count))
        for ci in array[:count.value]:
            info = N.nvmlComputeInstanceGetInfo(ci)
            out.append(ComputeInstance(id=info.id, profile_id=info.profileId,
                                       slices=prof.sliceCount,
                                       placement=Placement(info.placement.start, info.placement.size)))
    return tuple(sorted(out, key=lambda c: c.id))


def _read_mig_devices(h, index, uuid, gpu_minor, gis, profiles) -> tuple[MigDevice, ...]:
    """The MIG devices by index. NVML numbers them densely, but a reader cannot know that
    (go-nvlib and the container toolkit skip NOT_FOUND and INVALID_ARGUMENT indices), so
    every index up to the maximum is asked. ``gis`` None: the instances could not be
    listed, so each device's profile comes from its attributes and its placements are unknown."""
    by_id = {p.id: p for p in profiles}
    gi_by_id = {g.id: g for g in gis or ()}
    out = []
    for slot in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except N.NVMLError as e:
            if e.value in (N.NVML_ERROR_NOT_FOUND, N.NVML_ERROR_INVALID_ARGUMENT):
                continue   # no MIG device at this index
            raise
        gi_id, ci_id = N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m)
        attrs = N.nvmlDeviceGetAttributes_v2(m)
        gi = gi_by_id.get(gi_id)
        if gi is not None:
            ci = next(c for c in gi.compute_instances if c.id == ci_id)
            gprof, ci_slices, ci_profile_id = by_id[gi.profile_id], ci.slices, ci.profile_id
            placement, ci_placement = gi.placement, ci.placement
        else:
            gprof, ci_slices = _profile_of(attrs, profiles), attrs.computeInstanceSliceCount
            ci_profile_id = _CI_SLICES.index(ci_slices) if ci_slices in _CI_SLICES else 0
            placement = ci_placement = None
        name = gprof.name if gprof else f"{attrs.gpuInstanceSliceCount}g"
        profile = name if ci_slices == attrs.gpuInstanceSliceCount else f"{ci_slices}c.{name}"
        out.append(MigDevice(
            uuid=_text(N.nvmlDeviceGetUUID(m)), parent_index=index, parent_uuid=uuid,
            parent_minor=gpu_minor, index=slot, gi=gi_id, ci=ci_id, profile=profile,
            gi_profile_id=gprof.id if gprof else None, ci_profile_id=ci_profile_id,
            placement=placement, ci_placement=ci_placement, memory_mib=attrs.memorySizeMB,
            multiprocessors=attrs.multiprocessorCount, copy_engines=attrs.sharedCopyEngineCount,
            decoders=attrs.sharedDecoderCount, encoders=attrs.sharedEncoderCount,
            jpegs=attrs.sharedJpegCount, ofas=attrs.sharedOfaCount))
    return tuple(out)
