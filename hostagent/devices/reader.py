"""Read the node's GPUs through pynvml into an Inventory: the one place NVML handles live.

NVML errors are translated here, at the boundary: a missing library or driver becomes a
clear hostagent error, a GPU that cannot be read becomes an ``UnreadableGpu`` record so the
rest of the node is still reported.
"""

from __future__ import annotations

import contextlib
import math
import threading

import pynvml as N

from ..errors import DriverNotLoaded, NvmlError, NvmlLibraryMissing
from ..hostroot import HostRoot
from .records import (ComputeInstance, Gpu, GpuInstance, Inventory, MigDevice, MigProfile,
                      MigState, Placement, UnreadableGpu, sysfs_bus_id)

__all__ = ["nvml_session", "read_inventory", "mig_profile_name"]

ARCHITECTURES = {N.NVML_DEVICE_ARCH_KEPLER: "kepler", N.NVML_DEVICE_ARCH_MAXWELL: "maxwell",
                 N.NVML_DEVICE_ARCH_PASCAL: "pascal", N.NVML_DEVICE_ARCH_VOLTA: "volta",
                 N.NVML_DEVICE_ARCH_TURING: "turing", N.NVML_DEVICE_ARCH_AMPERE: "ampere",
                 N.NVML_DEVICE_ARCH_ADA: "ada", N.NVML_DEVICE_ARCH_HOPPER: "hopper",
                 N.NVML_DEVICE_ARCH_BLACKWELL: "blackwell"}

# Profile-name suffixes by NVML_GPU_INSTANCE_PROFILE_* value (REV1 = +me, ALL_ME, NO_ME, GFX).
_ATTRS = {7: "+me", 8: "+me", 15: "+me.all", 16: "+me.all", 13: "-me", 14: "-me",
          10: "+gfx", 11: "+gfx", 12: "+gfx", 17: "+gfx"}
_SKIP_PROFILE = (N.NVML_ERROR_NOT_SUPPORTED, N.NVML_ERROR_INVALID_ARGUMENT)
_NOT_APPLICABLE = 0xFFFFFFFF

_sim_lock = threading.Lock()


def _install_simulator(host: HostRoot) -> None:
    with _sim_lock:
        # Whatever library is beneath pynvml now (another node's fake included) is the one
        # to check: anyone may have installed one since this process last did.
        lib = N.nvmlLib
        if getattr(lib, "store", None) is None or lib.store.root != host.root:
            from ..sim import fakenvml   # only simulated runs pay for the simulator
            lib = fakenvml.install(host.root)
            lib.store.check()
    # A node whose files are unreadable is reported as such, naming the file, rather than
    # as a vague nvmlInit failure (cheap: the state is cached until it changes).
    lib.store.facts
    lib.store.read()


@contextlib.contextmanager
def nvml_session(host: HostRoot):
    """nvmlInit/nvmlShutdown around a block, with NVML's start-up errors made actionable."""
    if host.simulated:
        _install_simulator(host)
    try:
        N.nvmlInit()
    except N.NVMLError as e:
        if e.value == N.NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NvmlLibraryMissing(
                "the NVML library libnvidia-ml.so.1 could not be loaded",
                hint="install the NVIDIA driver's user-space libraries, or pass --simulate DIR "
                     "to use a simulated node", nvml_code=e.value) from None
        if e.value == N.NVML_ERROR_DRIVER_NOT_LOADED:
            raise DriverNotLoaded(
                "NVML is installed but the NVIDIA kernel driver is not loaded",
                hint="load it with 'modprobe nvidia' and check 'dmesg' for driver errors",
                nvml_code=e.value) from None
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


def read_inventory(host: HostRoot | None = None) -> Inventory:
    """Read every GPU and MIG device once; returns immutable records."""
    host = host or HostRoot.from_env()
    with nvml_session(host):
        cuda = N.nvmlSystemGetCudaDriverVersion()
        gpus, unreadable = [], []
        for index in range(N.nvmlDeviceGetCount()):
            try:
                gpus.append(_read_gpu(host, index))
            except N.NVMLError as e:
                unreadable.append(UnreadableGpu(index=index, error=str(e), nvml_code=e.value))
        return Inventory(
            driver_version=_text(N.nvmlSystemGetDriverVersion()),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
            nvml_version=_text(N.nvmlSystemGetNVMLVersion()),
            gpus=tuple(gpus), unreadable=tuple(unreadable), simulated=host.simulated,
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


def _read_gpu(host: HostRoot, index: int) -> Gpu:
    h = N.nvmlDeviceGetHandleByIndex(index)
    memory_mib = N.nvmlDeviceGetMemoryInfo(h).total >> 20
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
               numa_node=_numa_node(host, bus_id),
               pci_device_id=pci.pciDeviceId, pci_subsystem_id=pci.pciSubSystemId,
               compute_capability=f"{major}.{minor}",
               architecture=ARCHITECTURES.get(N.nvmlDeviceGetArchitecture(h), "unknown"),
               mig=_read_mig(h, index, uuid, gpu_minor, memory_mib))


def _read_mig(h, index: int, uuid: str, gpu_minor: int, memory_mib: int) -> MigState | None:
    try:
        current, pending = N.nvmlDeviceGetMigMode(h)
    except N.NVMLError_NotSupported:
        return None
    enabled = current == N.NVML_DEVICE_MIG_ENABLE
    profiles = _read_profiles(h, enabled, memory_mib)
    if not enabled:
        return MigState(enabled=False, pending=pending == N.NVML_DEVICE_MIG_ENABLE, profiles=profiles)
    by_id = {p.id: p for p in profiles}
    gis = _read_gpu_instances(h, profiles)
    devices = _read_mig_devices(h, index, uuid, gpu_minor, gis, by_id)
    return MigState(enabled=True, pending=pending == N.NVML_DEVICE_MIG_ENABLE,
                    profiles=profiles, gpu_instances=gis, devices=devices)


def _read_profiles(h, enabled: bool, memory_mib: int) -> tuple[MigProfile, ...]:
    out = []
    for idx in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            # The versioned call needs MIG enabled; the v1 struct answers either way.
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, idx, version=2 if enabled else 1)
        except N.NVMLError as e:
            if e.value in _SKIP_PROFILE:
                continue
            raise
        out.append(MigProfile(
            index=idx, id=info.id,
            name=mig_profile_name(idx, info.sliceCount, mig_memory_gb(memory_mib, info.memorySizeMB)),
            slices=info.sliceCount, instances=info.instanceCount, memory_mib=info.memorySizeMB,
            multiprocessors=info.multiprocessorCount, copy_engines=info.copyEngineCount,
            decoders=info.decoderCount, encoders=info.encoderCount, jpegs=info.jpegCount,
            ofas=info.ofaCount, placements=_gi_placements(h, info.id)))
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


def _read_mig_devices(h, index, uuid, gpu_minor, gis, by_id) -> tuple[MigDevice, ...]:
    gi_by_id = {g.id: g for g in gis}
    out = []
    for slot in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except N.NVMLError as e:
            if e.value in (N.NVML_ERROR_NOT_FOUND, N.NVML_ERROR_INVALID_ARGUMENT):
                continue   # empty slot
            raise
        gi_id, ci_id = N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m)
        gi = gi_by_id[gi_id]
        ci = next(c for c in gi.compute_instances if c.id == ci_id)
        gprof = by_id[gi.profile_id]
        attrs = N.nvmlDeviceGetAttributes_v2(m)
        profile = gprof.name if ci.slices == gprof.slices else f"{ci.slices}c.{gprof.name}"
        out.append(MigDevice(
            uuid=_text(N.nvmlDeviceGetUUID(m)), parent_index=index, parent_uuid=uuid,
            parent_minor=gpu_minor, index=slot, gi=gi_id, ci=ci_id, profile=profile,
            gi_profile_id=gi.profile_id, ci_profile_id=ci.profile_id, placement=gi.placement,
            ci_placement=ci.placement, memory_mib=attrs.memorySizeMB,
            multiprocessors=attrs.multiprocessorCount, copy_engines=attrs.sharedCopyEngineCount,
            decoders=attrs.sharedDecoderCount, encoders=attrs.sharedEncoderCount,
            jpegs=attrs.sharedJpegCount, ofas=attrs.sharedOfaCount))
    return tuple(out)
