"""A fake ``libnvidia-ml.so.1`` made of ctypes C functions, installed beneath pynvml.

pynvml looks functions up on its loaded library object (``pynvml.nvmlLib``) and calls
them with ctypes arguments. Replacing that object with ``FakeNvmlLibrary`` leaves all of
pynvml's own marshalling, struct versioning and error handling in the path. A function
the fake does not implement raises AttributeError, which pynvml turns into
NVML_ERROR_FUNCTION_NOT_FOUND; the name is also recorded in ``missing`` for tests.
Functions are declared with ``cfuncs.nvml``; the topology calls live in ``faketopology``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from ctypes import (CFUNCTYPE, c_char_p, c_int, c_uint, c_ulonglong, c_void_p,
                    sizeof)

import pynvml as N

from ..errors import HostagentError
from . import faketopology, gpm, vgpu  # noqa: F401  (their NVML functions register)
from . import nvmlopen, privilege, telemetry
from .catalog import ARCHITECTURES, BRANDS
from .cfuncs import FUNCS, P, normal_bus_id, nvml, put, put_str, sized, struct
from .clients import driver_clients
from .node import MIG_ENABLE, NodeState, SimGpu, SimNvmlError
from .nvlink import FIELDS      # nvmlDeviceGetFieldValues entries it answers: id -> fn(lib, state, gpu, mig, fv)
from .store import SimStore
from .versions import cuda_version, library_version, module_version

__all__ = ["FakeNvmlLibrary", "Fault", "install", "uninstall", "FAULT_ENV", "MUTATING"]

log = logging.getLogger(__name__)

# nvmlEventSetWait_v2 polls the state file: at once, then with pauses growing from 20 ms to
# 200 ms while nothing arrives (kept per event set across waits, reset by an event). A real
# driver blocks in the kernel; a fixed 20 ms poll cost ~1% of a core in an idle daemon.
_WAIT_POLL_MIN, _WAIT_POLL_MAX = 0.02, 0.2

SUPPORTED_EVENTS = (N.nvmlEventTypeSingleBitEccError | N.nvmlEventTypeDoubleBitEccError
                    | N.nvmlEventTypePState | N.nvmlEventTypeXidCriticalError
                    | N.nvmlEventTypeClock)


# nvmlErrorString texts for codes pynvml has no text for.
ERROR_STRINGS = {
    N.NVML_ERROR_IN_USE: "In use by another client",
    N.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    N.NVML_ERROR_NO_DATA: "No data",
}


# Faults a test can make the simulated driver commit, on the calls that change MIG state.
FAULT_ENV = "HOSTAGENT_SIM_FAULT"
# Driver branches that list MIG profiles only while MIG mode is enabled.
NO_PROFILES_WHILE_DISABLED = ("535.",)
MUTATING = frozenset({
    "nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstance", "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceCreateComputeInstance", "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    "nvmlGpuInstanceDestroy", "nvmlComputeInstanceDestroy"})
FAULT_ACTIONS = ("error", "kill-before", "kill-after")


@dataclass
class Fault:
    """After ``after`` mutating calls pass, the next one fails with ``code`` ("error"), or
    the calling process is killed (SIGKILL) before or after the call takes effect, as a
    crash or power cut in the middle of a MIG change would."""
    action: str
    after: int = 0
    code: int = N.NVML_ERROR_UNKNOWN

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """``ACTION:AFTER[:CODE]``, e.g. ``kill-after:3`` or ``error:0:23``."""
        parts = text.strip().split(":")
        if parts[0] not in FAULT_ACTIONS or len(parts) not in (2, 3):
            raise ValueError(f"bad simulated NVML fault {text!r}: want ACTION:AFTER[:CODE] with "
                             f"ACTION one of {', '.join(FAULT_ACTIONS)}")
        return cls(parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else N.NVML_ERROR_UNKNOWN)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    while True:               # SIGKILL to oneself lands before kill() returns; be sure anyway
        time.sleep(1)


class FakeNvmlLibrary:
    def __init__(self, store: SimStore):
        self.store = store
        self.calls: Counter[str] = Counter()
        self.missing: list[str] = []
        self.crashes: list[str] = []
        self._handles: dict[tuple, ctypes.Array] = {}
        self._keys: dict[int, tuple] = {}
        self._event_sets: dict[int, dict] = {}
        self._next_event_set = 1
        self._energy: dict[int, tuple[float, float, float]] = {}   # gpu -> (boot, t, mJ)
        self._initialised = 0
        self._opened: set[str] = set()      # bus ids of the GPUs this process has open (_open)
        self._opener = os.getpid()
        self._open_lock = threading.RLock()
        self._error_strings: dict[int, ctypes.Array] = {}
        self.modules: dict = {}      # what the simulator's other modules keep in this process
        # Queued faults; in memory, so they belong to this process (a child started with
        # HOSTAGENT_SIM_FAULT set gets its own).
        self.faults: list[Fault] = [Fault.parse(f) for f in os.environ.get(FAULT_ENV, "").split(",") if f]
        self._funcs = {name: self._bind(name, argtypes, impl)
                       for name, (argtypes, impl) in FUNCS.items()}
        # nvmlErrorString returns a char*; pynvml sets restype itself.
        self._funcs["nvmlErrorString"] = CFUNCTYPE(c_void_p, c_int)(self._error_string)
        # Instance attributes shadow the Python methods of the same name: callers get C functions.
        self.__dict__.update(self._funcs)

    def __getattr__(self, name):
        self.__dict__.setdefault("missing", []).append(name)
        raise AttributeError(f"simulated NVML has no function {name}")

    # ---- plumbing ------------------------------------------------------------------

    def inject(self, action: str, after: int = 0, code: int = N.NVML_ERROR_UNKNOWN) -> Fault:
        """Queue a fault on the mutating calls of this process (see ``Fault``)."""
        fault = Fault.parse(f"{action}:{after}:{code}")
        self.faults.append(fault)
        return fault

    def _fault(self, name: str) -> Fault | None:
        if name not in MUTATING or not self.faults:
            return None
        head = self.faults[0]
        if head.after > 0:
            head.after -= 1
            return None
        return self.faults.pop(0)

    def _bind(self, name, argtypes, impl):
        def call(*args):
            self.calls[name] += 1
            try:
                if name not in ("nvmlInitWithFlags", "nvmlInit_v2") and not self._initialised:
                    return N.NVML_ERROR_UNINITIALIZED
                fault = self._fault(name)
                if fault is not None:
                    if fault.action == "error":
                        return fault.code
                    if fault.action == "kill-before":
                        _die()
                    try:
                        impl(self, *args)
                    finally:
                        _die()
                return impl(self, *args) or N.NVML_SUCCESS
            except SimNvmlError as e:
                return e.code
            except HostagentError as e:   # the node's files, not a bug: say which
                log.error("simulated NVML: %s", e.message)
                return N.NVML_ERROR_UNKNOWN
            except Exception:   # never let a bug look like NVML_SUCCESS
                self.crashes.append(f"{name}: {traceback.format_exc()}")
                log.error("simulated NVML crashed in %s", name, exc_info=True)
                return N.NVML_ERROR_UNKNOWN
        return CFUNCTYPE(c_int, *argtypes)(call)

    def _error_string(self, code):
        if code not in self._error_strings:
            text = ERROR_STRINGS.get(code) or N.NVMLError._errcode_to_string.get(code, "Unknown Error")
            self._error_strings[code] = ctypes.create_string_buffer(text.encode())
        return ctypes.addressof(self._error_strings[code])

    def _handle(self, *key) -> int:
        if key not in self._handles:
            buf = ctypes.create_string_buffer(8)
            self._handles[key] = buf
            self._keys[ctypes.addressof(buf)] = key
        return ctypes.addressof(self._handles[key])

    def _put_handle(self, ptr: int, *key) -> None:
        put(ptr, c_void_p, self._handle(*key))

    def _key(self, handle: int | None) -> tuple:
        key = self._keys.get(handle or 0)
        if key is None:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "invalid handle")
        return key

    def _state(self) -> NodeState:
        return self.store.read()

    @property
    def facts(self):
        return self.store.facts

    def _device(self, handle, state=None):
        """(state, gpu, mig) for a device handle; mig is (gi, ci) or None."""
        state = state or self._state()
        key = self._key(handle)
        if key[0] in ("gpu", "mig") and not state.gpu(key[1]).on_nvidia:
            # The nvidia driver let the GPU go (sim/pcibus.py): its handles name nothing now.
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "the GPU is no longer the nvidia driver's")
        if key[0] == "gpu":
            return state, state.live_gpu(key[1]), None
        if key[0] == "mig":
            _, gi, ci = state.find_ci(key[1], key[2], key[3])
            return state, state.live_gpu(key[1]), (gi, ci)
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "not a device handle")

    def _gpu_only(self, handle):
        state, gpu, mig = self._device(handle)
        if mig is not None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "not supported on a MIG device")
        return state, gpu

    def _gi(self, handle, state=None):
        state = state or self._state()
        key = self._key(handle)
        if key[0] != "gi":
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "not a GPU instance handle")
        gpu, gi = state.find_gi(key[1], key[2])
        return state, gpu, gi

    def _ci(self, handle):
        state = self._state()
        key = self._key(handle)
        if key[0] != "ci":
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "not a compute instance handle")
        gpu, gi, ci = state.find_ci(key[1], key[2], key[3])
        return state, gpu, gi, ci

    def _sku(self, gpu: SimGpu):
        return self.facts.skus[gpu.sku]

    def _mutate(self, fn):
        with self.store.mutate() as state:
            return fn(state)

    def _monitoring(self, what: str) -> None:
        """NO_PERMISSION for a call nvml.h reserves to a privileged user (sim.privilege)."""
        if not privilege.can_monitor(self.store.root):
            raise SimNvmlError(N.NVML_ERROR_NO_PERMISSION, f"{what} needs the mig/monitor capability")

    def _configuring(self, what: str) -> None:
        if not privilege.can_configure(self.store.root):
            raise SimNvmlError(N.NVML_ERROR_NO_PERMISSION, f"{what} needs the mig/config capability")

    def _aggregate(self, gpu: SimGpu, mig) -> None:
        """A MIG-enabled GPU's own handle answers memory and process queries in aggregate
        "only if the caller has appropriate privileges" (nvml.h)."""
        if mig is None and gpu.mig_current == MIG_ENABLE and self._sku(gpu).mig is not None:
            self._monitoring("aggregate information of a MIG-enabled GPU")

    # ---- init and system -----------------------------------------------------------

    @nvml(c_uint)
    def nvmlInitWithFlags(self, flags):
        if not self.store.exists():
            return N.NVML_ERROR_LIBRARY_NOT_FOUND
        state = self._state()
        if not state.driver_loaded:
            return N.NVML_ERROR_DRIVER_NOT_LOADED
        # The library is the file libnvidia-ml.so.1 names (what packages install); it refuses
        # a kernel module of another version (as the kernel reports it in /sys/module), as
        # nvidia-smi's "Driver/library version mismatch".
        library = library_version(self.store.root)
        if library is None:
            return N.NVML_ERROR_LIBRARY_NOT_FOUND
        if library != module_version(self.store.root, library):
            return N.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        with self._open_lock:
            self._initialised += 1

    def _driver_version(self, state=None) -> str:
        """The loaded kernel module's version (sim/kmod.py)."""
        return (state or self._state()).driver.get("module_version") or self.facts.driver_version

    @nvml()
    def nvmlInit_v2(self):
        return FUNCS["nvmlInitWithFlags"][1](self, 0)

    @nvml()
    def nvmlShutdown(self):
        with self._open_lock:
            self._initialised = max(0, self._initialised - 1)
            if not self._initialised:
                self.close_gpus()

    def _open(self, gpu: SimGpu) -> None:
        """A handle taken "causes NVML to initialize the target GPU" (nvml.h): its device
        node stays open, counted by the driver, until the process's last nvmlShutdown
        (sim/nvmlopen.py)."""
        with self._open_lock:
            if self._opener != os.getpid():          # a forked child holds nothing of its own yet
                self._opener, self._opened = os.getpid(), set()
            if gpu.pci_bus_id not in self._opened:
                self._opened.add(gpu.pci_bus_id)
                nvmlopen.attach(self.store, gpu.pci_bus_id)

    def close_gpus(self) -> None:
        """The GPUs this process opened are closed (its last nvmlShutdown, or this library
        no longer beneath pynvml)."""
        with self._open_lock:
            if self._opened and self._opener == os.getpid():
                nvmlopen.detach(self.store)
            self._opened = set()

    @nvml(P, c_uint)
    def nvmlSystemGetDriverVersion(self, buf, length):
        put_str(buf, length, self._driver_version())

    @nvml(P, c_uint)
    def nvmlSystemGetNVMLVersion(self, buf, length):
        put_str(buf, length, f"{cuda_version(self.store.root, self.facts) // 1000}.{self._driver_version()}")

    @nvml(P)
    def nvmlSystemGetCudaDriverVersion(self, ptr):
        put(ptr, c_int, cuda_version(self.store.root, self.facts))

    @nvml(P)
    def nvmlSystemGetCudaDriverVersion_v2(self, ptr):
        put(ptr, c_int, cuda_version(self.store.root, self.facts))

    # ---- device handles ------------------------------------------------------------

    # NVML numbers the GPUs the nvidia driver holds, 0 to count-1 in PCI order
    # (NodeState.nvml_gpus): a GPU bound to vfio-pci is not counted, and those after it
    # move down, until it is bound back.

    @nvml(P)
    def nvmlDeviceGetCount_v2(self, ptr):
        put(ptr, c_uint, len(self._state().nvml_gpus()))

    @nvml(c_uint, P)
    def nvmlDeviceGetHandleByIndex_v2(self, index, ptr):
        state = self._state()
        visible = state.nvml_gpus()
        if index >= len(visible):
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"no GPU {index}")
        self._open(state.live_gpu(visible[index].index))
        self._put_handle(ptr, "gpu", visible[index].index)

    @nvml(c_char_p, P)
    def nvmlDeviceGetHandleByUUID(self, uuid, ptr):
        uuid = (uuid or b"").decode()
        state = self._state()
        for gpu in state.nvml_gpus():
            if gpu.uuid == uuid:
                self._open(state.live_gpu(gpu.index))
                return self._put_handle(ptr, "gpu", gpu.index)
            for gi in gpu.gis:
                for ci in gi.cis:
                    if ci.uuid == uuid:
                        self._open(gpu)          # a MIG device is reached through its GPU's node
                        return self._put_handle(ptr, "mig", gpu.index, gi.id, ci.id)
        raise SimNvmlError(N.NVML_ERROR_NOT_FOUND, f"no device {uuid}")

    @nvml(c_char_p, P)
    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id, ptr):
        want = normal_bus_id((bus_id or b"").decode())
        for gpu in self._state().nvml_gpus():
            if normal_bus_id(gpu.pci_bus_id) == want:
                self._open(self._state().live_gpu(gpu.index))
                return self._put_handle(ptr, "gpu", gpu.index)
        raise SimNvmlError(N.NVML_ERROR_NOT_FOUND, f"no device at {want}")

    # ---- device facts --------------------------------------------------------------

    @nvml(P, P, c_uint)
    def nvmlDeviceGetName(self, handle, buf, length):
        state, gpu, mig = self._device(handle)
        name = self._sku(gpu).name
        if mig:
            name += " MIG " + self._mig_profile_name(gpu, *mig)
        put_str(buf, length, name)

    @nvml(P, P, c_uint)
    def nvmlDeviceGetUUID(self, handle, buf, length):
        _, gpu, mig = self._device(handle)
        put_str(buf, length, mig[1].uuid if mig else gpu.uuid)

    @nvml(P, P, c_uint)
    def nvmlDeviceGetSerial(self, handle, buf, length):
        _, gpu = self._gpu_only(handle)
        put_str(buf, length, gpu.serial)

    @nvml(P, P)
    def nvmlDeviceGetMinorNumber(self, handle, ptr):
        _, gpu = self._gpu_only(handle)
        put(ptr, c_uint, gpu.minor)

    @nvml(P, P)
    def nvmlDeviceGetPciInfo_v3(self, handle, ptr):
        _, gpu, _ = self._device(handle)
        sku = self._sku(gpu)
        info = struct(ptr, N.nvmlPciInfo_t)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        dev = rest.split(".")[0]
        nvml_id = normal_bus_id(gpu.pci_bus_id).encode()
        info.busIdLegacy = nvml_id
        info.busId = nvml_id
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(dev, 16)
        info.pciDeviceId, info.pciSubSystemId = sku.pci_device_id, sku.pci_subsystem_id

    @nvml(P, P)
    def nvmlDeviceGetMemoryInfo(self, handle, ptr):
        total, used = self._memory(handle)
        mem = struct(ptr, N.c_nvmlMemory_t)
        mem.total, mem.used, mem.free = total, used, total - used

    @nvml(P, P)
    def nvmlDeviceGetMemoryInfo_v2(self, handle, ptr):
        mem = struct(ptr, N.c_nvmlMemory_v2_t)
        if mem.version != N.nvmlMemory_v2:
            raise SimNvmlError(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "nvmlMemory_v2 expected")
        total, used = self._memory(handle)
        reserved = 0 if self._key(handle)[0] == "mig" else min(total - used, 512 << 20)
        mem.total, mem.reserved, mem.used = total, reserved, used
        mem.free = total - used - reserved

    def _memory(self, handle) -> tuple[int, int]:
        state, gpu, mig = self._device(handle)
        self._aggregate(gpu, mig)
        if mig:
            gi, ci = mig
            total = self._sku(gpu).mig.by_id(gi.profile_id).memory_mib
            used = sum(p.used_mib for p in state.processes_on(gpu.index, gi.id))
        else:
            total = self._sku(gpu).memory_mib
            used = sum(p.used_mib for p in state.processes_on(gpu.index))
        return total << 20, used << 20

    @nvml(P, P, P)
    def nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
        _, gpu, _ = self._device(handle)
        cc = self._sku(gpu).compute_capability
        put(major, c_int, cc[0])
        put(minor, c_int, cc[1])

    @nvml(P, P)
    def nvmlDeviceGetArchitecture(self, handle, ptr):
        _, gpu, _ = self._device(handle)
        put(ptr, c_uint, self._sku(gpu).nvml_architecture)

    @nvml(P, P)
    def nvmlDeviceGetBrand(self, handle, ptr):
        _, gpu, _ = self._device(handle)
        put(ptr, c_uint, BRANDS[self._sku(gpu).brand])

    @nvml(P, P)
    def nvmlDeviceGetAttributes_v2(self, handle, ptr):
        _, gpu, mig = self._device(handle)
        if mig is None:     # nvml.h: "This API currently only supports MIG device handles."
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "attributes of a whole GPU")
        sku = self._sku(gpu)
        attrs = struct(ptr, N.c_nvmlDeviceAttributes)
        gi, ci = mig
        gprof = sku.mig.by_id(gi.profile_id)
        cprof = gprof.ci_profile(ci.profile_id)
        attrs.multiprocessorCount = cprof.multiprocessors
        attrs.sharedCopyEngineCount = gprof.copy_engines
        attrs.sharedDecoderCount, attrs.sharedEncoderCount = gprof.decoders, gprof.encoders
        attrs.sharedJpegCount, attrs.sharedOfaCount = gprof.jpegs, gprof.ofas
        attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount = gprof.slices, cprof.slices
        attrs.memorySizeMB = gprof.memory_mib

    @nvml(P, P, P)
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count_ptr, infos):
        state, gpu, mig = self._device(handle)
        self._aggregate(gpu, mig)
        if mig:
            procs = state.processes_on(gpu.index, mig[0].id, mig[1].id)
        else:
            procs = state.processes_on(gpu.index)
        have = c_uint.from_address(count_ptr).value
        put(count_ptr, c_uint, len(procs))
        if not procs:
            return
        if have < len(procs) or not infos:
            raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_SIZE, "process buffer too small")
        for i, p in enumerate(procs):
            info = N.c_nvmlProcessInfo_v3_t.from_address(infos + i * sizeof(N.c_nvmlProcessInfo_v3_t))
            info.pid, info.usedGpuMemory = p.pid, p.used_mib << 20
            info.gpuInstanceId = 0xFFFFFFFF if p.gi is None else p.gi
            info.computeInstanceId = 0xFFFFFFFF if p.ci is None else p.ci

    @nvml(P, P)
    def nvmlDeviceGetPersistenceMode(self, handle, ptr):
        # On while nvidia-persistenced holds the GPU (from its start, until nvidia-smi -pm 0
        # lets it go or the GPU leaves the driver), or while the driver's own (legacy) flag is set.
        state, gpu = self._gpu_only(handle)
        from .pcibus import persistenced_holds
        on = gpu.persistence or persistenced_holds(self.store.root, gpu)
        put(ptr, c_uint, N.NVML_FEATURE_ENABLED if on else N.NVML_FEATURE_DISABLED)

    @nvml(P, c_uint)
    def nvmlDeviceSetPersistenceMode(self, handle, mode):
        # The driver's legacy flag (nvml.h: "Requires root/admin permissions"); what NVIDIA's
        # DRA driver sets on a GPU bound back, which nvidia-persistenced does not take again.
        _, gpu = self._gpu_only(handle)
        if not privilege.sys_admin():
            raise SimNvmlError(N.NVML_ERROR_NO_PERMISSION, "persistence mode needs root")
        if mode not in (N.NVML_FEATURE_DISABLED, N.NVML_FEATURE_ENABLED):
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad persistence mode {mode}")

        def change(state):
            state.gpu(gpu.index).persistence = mode == N.NVML_FEATURE_ENABLED
        self._mutate(change)

    @nvml(P, P)
    def nvmlDeviceGetGpuFabricInfo(self, handle, ptr):
        # nvml.h: Hopper or newer; the fabric registers once the fabric manager runs.
        state, gpu = self._gpu_only(handle)
        if not self.facts.nvswitches or self._sku(gpu).nvml_architecture < ARCHITECTURES["hopper"]:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "no NVSwitch fabric")
        info = struct(ptr, N.c_nvmlGpuFabricInfo_t)
        running = state.driver.get("fabric_manager", True)
        info.state = N.NVML_GPU_FABRIC_STATE_COMPLETED if running else N.NVML_GPU_FABRIC_STATE_NOT_STARTED
        info.status = N.NVML_SUCCESS
        info.cliqueId = 1 if running else 0

    # ---- compute mode ----------------------------------------------------------------
    # A whole-GPU setting (nvidia-smi -c takes a GPU): MIG device handles answer NOT_SUPPORTED,
    # as the simulator's other GPU-wide queries on them do.

    @nvml(P, P)
    def nvmlDeviceGetComputeMode(self, handle, ptr):
        _, gpu = self._gpu_only(handle)
        put(ptr, c_uint, gpu.compute_mode)

    @nvml(P, c_uint)
    def nvmlDeviceSetComputeMode(self, handle, mode):
        _, gpu = self._gpu_only(handle)
        if not privilege.sys_admin():   # nvml.h "Requires root/admin permissions"
            raise SimNvmlError(N.NVML_ERROR_NO_PERMISSION, "compute modes need root")
        self._mutate(lambda s: s.set_compute_mode(gpu.index, mode))

    # ---- MIG mode and MIG devices --------------------------------------------------

    def _mig_capable(self, handle):
        state, gpu = self._gpu_only(handle)
        if self._sku(gpu).mig is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "GPU is not MIG capable")
        return state, gpu

    @nvml(P, P, P)
    def nvmlDeviceGetMigMode(self, handle, current, pending):
        _, gpu = self._mig_capable(handle)
        put(current, c_uint, gpu.mig_current)
        put(pending, c_uint, gpu.mig_pending)

    @nvml(P, c_uint, P)
    def nvmlDeviceSetMigMode(self, handle, mode, status_ptr):
        _, gpu = self._mig_capable(handle)
        if not privilege.sys_admin():   # nvml.h "Requires root user"; the guide: CAP_SYS_ADMIN
            raise SimNvmlError(N.NVML_ERROR_NO_PERMISSION, "MIG mode needs CAP_SYS_ADMIN")
        clients = driver_clients(self.store.root)
        status = self._mutate(lambda s: s.set_mig_mode(self.facts, gpu.index, mode, clients))
        put(status_ptr, c_uint, status)

    @nvml(P, P)
    def nvmlDeviceGetMaxMigDeviceCount(self, handle, ptr):
        _, gpu = self._gpu_only(handle)
        mig = self._sku(gpu).mig
        on = mig is not None and gpu.mig_current == MIG_ENABLE
        put(ptr, c_uint, mig.compute_slices if on else 0)

    @nvml(P, P)
    def nvmlDeviceIsMigDeviceHandle(self, handle, ptr):
        put(ptr, c_uint, int(self._key(handle)[0] == "mig"))

    @nvml(P, P)
    def nvmlDeviceGetIndex(self, handle, ptr):
        # nvml.h: on a MIG device handle, the index nvmlDeviceGetMigDeviceHandleByIndex takes.
        state, gpu, mig = self._device(handle)
        if mig is None:
            return put(ptr, c_uint, state.nvml_gpus().index(gpu))
        put(ptr, c_uint, next(i for i, (gi, ci) in state.mig_devices(gpu.index).items()
                               if (gi.id, ci.id) == (mig[0].id, mig[1].id)))

    @nvml(P, c_uint, P)
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index, ptr):
        # nvml.h: NOT_SUPPORTED where the query is not (no MIG, or MIG mode disabled: sibling
        # MIG queries say so), INVALID_ARGUMENT for an index past the GPU's maximum,
        # NOT_FOUND past its MIG devices (numbered densely: docs/simulator.md).
        state, gpu = self._gpu_only(handle)
        mig = self._sku(gpu).mig
        if mig is None or gpu.mig_current != MIG_ENABLE:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "MIG mode is not enabled")
        if index >= mig.compute_slices:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"MIG device index {index} is past the maximum")
        found = state.mig_devices(gpu.index).get(index)
        if found is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_FOUND, f"no MIG device {index}")
        gi, ci = found
        self._put_handle(ptr, "mig", gpu.index, gi.id, ci.id)

    @nvml(P, P)
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle, ptr):
        _, gpu, mig = self._device(handle)
        if mig is None:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "not a MIG device handle")
        self._put_handle(ptr, "gpu", gpu.index)

    @nvml(P, P)
    def nvmlDeviceGetGpuInstanceId(self, handle, ptr):
        _, _, mig = self._device(handle)
        if mig is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "not a MIG device handle")
        put(ptr, c_uint, mig[0].id)

    @nvml(P, P)
    def nvmlDeviceGetComputeInstanceId(self, handle, ptr):
        _, _, mig = self._device(handle)
        if mig is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "not a MIG device handle")
        put(ptr, c_uint, mig[1].id)

    def _mig_profile_name(self, gpu, gi, ci) -> str:
        gprof = self._sku(gpu).mig.by_id(gi.profile_id)
        cprof = gprof.ci_profile(ci.profile_id)
        if cprof.slices == gprof.slices:
            return gprof.name
        return f"{cprof.slices}c.{gprof.name}"

    # ---- GPU instance profiles and placements --------------------------------------

    def _enabled_profile(self, handle, *, index=None, profile_id=None, need_enabled=True):
        _, gpu = self._mig_capable(handle)
        if need_enabled and gpu.mig_current != MIG_ENABLE:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "MIG mode is not enabled")
        mig = self._sku(gpu).mig
        if index is not None:
            if index >= N.NVML_GPU_INSTANCE_PROFILE_COUNT:
                raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad profile {index}")
            prof = mig.by_index(index)
        else:
            prof = mig.by_id(profile_id)
        if prof is None:
            code = N.NVML_ERROR_NOT_SUPPORTED if index is not None else N.NVML_ERROR_INVALID_ARGUMENT
            raise SimNvmlError(code, "profile not supported on this GPU")
        return gpu, prof

    @staticmethod
    def _fill_gi_profile(info, prof, version):
        info.id, info.sliceCount, info.instanceCount = prof.id, prof.slices, prof.instances
        info.multiprocessorCount, info.copyEngineCount = prof.multiprocessors, prof.copy_engines
        info.decoderCount, info.encoderCount = prof.decoders, prof.encoders
        info.jpegCount, info.ofaCount = prof.jpegs, prof.ofas
        info.memorySizeMB = prof.memory_mib
        if version == 1:
            info.isP2pSupported = 0
        else:
            info.name = f"MIG {prof.name}".encode()
            if version == 3:
                info.capabilities = 0
            else:
                info.isP2pSupported = 0

    def _gi_profile_struct(self, ptr):
        version = c_uint.from_address(ptr).value
        if version == N.nvmlGpuInstanceProfileInfo_v2:
            return N.c_nvmlGpuInstanceProfileInfo_v2_t.from_address(ptr), 2
        if version == getattr(N, "nvmlGpuInstanceProfileInfo_v3", -1):
            return N.c_nvmlGpuInstanceProfileInfo_v3_t.from_address(ptr), 3
        raise SimNvmlError(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, f"struct version {version:#x}")

    @nvml(P, c_uint, P)
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, index, ptr):
        # nvml.h: the unversioned call fails only if the GPU lacks MIG; the V calls also
        # fail while MIG mode is disabled. Drivers such as R535 list no profile while MIG
        # is disabled, the unversioned call included (mig.md 1.1, ErrNoProfilesDiscovered).
        lists_disabled = not self._driver_version().startswith(NO_PROFILES_WHILE_DISABLED)
        _, prof = self._enabled_profile(handle, index=index, need_enabled=not lists_disabled)
        self._fill_gi_profile(struct(ptr, N.c_nvmlGpuInstanceProfileInfo_t), prof, 1)

    @nvml(P, c_uint, P)
    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle, index, ptr):
        info, version = self._gi_profile_struct(ptr)
        _, prof = self._enabled_profile(handle, index=index)
        self._fill_gi_profile(info, prof, version)

    @nvml(P, c_uint, P)
    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, handle, profile_id, ptr):
        info, version = self._gi_profile_struct(ptr)
        _, prof = self._enabled_profile(handle, profile_id=profile_id)
        self._fill_gi_profile(info, prof, version)

    @nvml(P, c_uint, P, P)
    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(self, handle, profile_id, array, count_ptr):
        # Documented to work whether or not MIG is enabled; "Requires privileged user".
        _, gpu = self._mig_capable(handle)
        self._monitoring("possible placements")
        prof = self._sku(gpu).mig.by_id(profile_id)
        if prof is None:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"no profile id {profile_id}")
        self._put_placements(array, count_ptr, prof.placements, prof.memory_slices,
                             N.c_nvmlGpuInstancePlacement_t)

    @staticmethod
    def _put_placements(array, count_ptr, starts, size, ctype):
        if not sized(count_ptr, array, len(starts), "placement"):
            return
        for i, start in enumerate(starts):
            pl = ctype.from_address(array + i * sizeof(ctype))
            pl.start, pl.size = start, size

    @nvml(P, c_uint, P)
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle, profile_id, ptr):
        gpu, prof = self._enabled_profile(handle, profile_id=profile_id)
        self._monitoring("remaining capacity")
        put(ptr, c_uint, self._state().gi_remaining(self.facts, gpu.index, prof))

    # ---- GPU instance lifecycle ----------------------------------------------------

    def _create_gi(self, handle, profile_id, placement, out):
        _, gpu = self._mig_capable(handle)
        self._configuring("creating a GPU instance")
        gi = self._mutate(lambda s: s.create_gi(self.facts, gpu.index, profile_id, placement))
        self._put_handle(out, "gi", gpu.index, gi.id)

    @nvml(P, c_uint, P)
    def nvmlDeviceCreateGpuInstance(self, handle, profile_id, out):
        self._create_gi(handle, profile_id, None, out)

    @nvml(P, c_uint, P, P)
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profile_id, placement, out):
        pl = struct(placement, N.c_nvmlGpuInstancePlacement_t)
        self._create_gi(handle, profile_id, (pl.start, pl.size), out)

    @nvml(P, c_uint, P, P)
    def nvmlDeviceGetGpuInstances(self, handle, profile_id, array, count_ptr):
        # nvml.h: the buffer must hold the profile's instanceCount entries; *count is only
        # written (how many were returned), never read as the buffer's size.
        gpu, prof = self._enabled_profile(handle, profile_id=profile_id)
        self._monitoring("listing GPU instances")
        if not array or not count_ptr:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "NULL buffer or count")
        gis = [g for g in gpu.gis if g.profile_id == prof.id]
        put(count_ptr, c_uint, len(gis))
        for i, gi in enumerate(gis):
            put(array + i * sizeof(c_void_p), c_void_p, self._handle("gi", gpu.index, gi.id))

    @nvml(P, c_uint, P)
    def nvmlDeviceGetGpuInstanceById(self, handle, gi_id, out):
        _, gpu = self._mig_capable(handle)
        if gpu.mig_current != MIG_ENABLE:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "MIG mode is not enabled")
        self._monitoring("a GPU instance by id")
        if gpu.gi(gi_id) is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_FOUND, f"no GPU instance {gi_id}")
        self._put_handle(out, "gi", gpu.index, gi_id)

    @nvml(P, P)
    def nvmlGpuInstanceGetInfo(self, handle, ptr):
        _, gpu, gi = self._gi(handle)
        info = struct(ptr, N.c_nvmlGpuInstanceInfo_t)
        put(ptr, c_void_p, self._handle("gpu", gpu.index))   # .device is the first field
        info.id, info.profileId = gi.id, gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size

    @nvml(P)
    def nvmlGpuInstanceDestroy(self, handle):
        _, gpu, gi = self._gi(handle)
        self._configuring("destroying a GPU instance")
        self._mutate(lambda s: s.destroy_gi(gpu.index, gi.id))

    # ---- compute instances ---------------------------------------------------------

    def _ci_profile(self, gpu, gi, profile_id, eng_profile=0):
        if profile_id >= N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad CI profile {profile_id}")
        if eng_profile != N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad engine profile {eng_profile}")
        gprof = self._sku(gpu).mig.by_id(gi.profile_id)
        cprof = gprof.ci_profile(profile_id)
        if cprof is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "CI profile does not fit this GI")
        return gprof, cprof

    def _fill_ci_profile(self, info, gpu, gi, gprof, cprof, version):
        info.id, info.sliceCount, info.instanceCount = cprof.id, cprof.slices, cprof.instances
        info.multiprocessorCount = cprof.multiprocessors
        info.sharedCopyEngineCount = gprof.copy_engines
        info.sharedDecoderCount, info.sharedEncoderCount = gprof.decoders, gprof.encoders
        info.sharedJpegCount, info.sharedOfaCount = gprof.jpegs, gprof.ofas
        if version >= 2:
            name = gprof.name if cprof.slices == gprof.slices else f"{cprof.slices}c.{gprof.name}"
            info.name = f"MIG {name}".encode()

    @nvml(P, c_uint, c_uint, P)
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, handle, profile, eng, ptr):
        _, gpu, gi = self._gi(handle)
        gprof, cprof = self._ci_profile(gpu, gi, profile, eng)
        self._fill_ci_profile(struct(ptr, N.c_nvmlComputeInstanceProfileInfo_t), gpu, gi, gprof, cprof, 1)

    @nvml(P, c_uint, c_uint, P)
    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, handle, profile, eng, ptr):
        version = c_uint.from_address(ptr).value if ptr else 0
        if version != N.nvmlComputeInstanceProfileInfo_v2:
            raise SimNvmlError(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, f"struct version {version:#x}")
        _, gpu, gi = self._gi(handle)
        gprof, cprof = self._ci_profile(gpu, gi, profile, eng)
        self._fill_ci_profile(N.c_nvmlComputeInstanceProfileInfo_v2_t.from_address(ptr),
                              gpu, gi, gprof, cprof, 2)

    @nvml(P, c_uint, P)
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, handle, profile_id, ptr):
        _, gpu, gi = self._gi(handle)
        self._monitoring("remaining capacity")
        gprof, cprof = self._ci_profile(gpu, gi, profile_id)
        used = {s for c in gi.cis for s in range(c.start, c.start + c.size)}
        free = [s for s in cprof.placements if used.isdisjoint(range(s, s + cprof.slices))]
        left = cprof.instances - sum(c.profile_id == profile_id for c in gi.cis)
        put(ptr, c_uint, max(0, min(len(free), left)))

    @nvml(P, c_uint, P, P)
    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(self, handle, profile_id, array, count_ptr):
        _, gpu, gi = self._gi(handle)
        self._monitoring("possible placements")
        _, cprof = self._ci_profile(gpu, gi, profile_id)
        self._put_placements(array, count_ptr, cprof.placements, cprof.slices,
                             N.c_nvmlComputeInstancePlacement_t)

    def _create_ci(self, handle, profile_id, placement, out):
        _, gpu, gi = self._gi(handle)
        self._configuring("creating a compute instance")
        self._ci_profile(gpu, gi, profile_id)
        ci = self._mutate(lambda s: s.create_ci(self.facts, gpu.index, gi.id, profile_id, placement))
        self._put_handle(out, "ci", gpu.index, gi.id, ci.id)

    @nvml(P, c_uint, P)
    def nvmlGpuInstanceCreateComputeInstance(self, handle, profile_id, out):
        self._create_ci(handle, profile_id, None, out)

    @nvml(P, c_uint, P, P)
    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(self, handle, profile_id, placement, out):
        pl = struct(placement, N.c_nvmlComputeInstancePlacement_t)
        self._create_ci(handle, profile_id, (pl.start, pl.size), out)

    @nvml(P, c_uint, P, P)
    def nvmlGpuInstanceGetComputeInstances(self, handle, profile_id, array, count_ptr):
        # As nvmlDeviceGetGpuInstances: a buffer of the CI profile's instanceCount, *count out.
        _, gpu, gi = self._gi(handle)
        self._ci_profile(gpu, gi, profile_id)
        self._monitoring("listing compute instances")
        if not array or not count_ptr:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "NULL buffer or count")
        cis = [c for c in gi.cis if c.profile_id == profile_id]
        put(count_ptr, c_uint, len(cis))
        for i, ci in enumerate(cis):
            put(array + i * sizeof(c_void_p), c_void_p, self._handle("ci", gpu.index, gi.id, ci.id))

    @nvml(P, c_uint, P)
    def nvmlGpuInstanceGetComputeInstanceById(self, handle, ci_id, out):
        _, gpu, gi = self._gi(handle)
        self._monitoring("a compute instance by id")
        if gi.ci(ci_id) is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_FOUND, f"no compute instance {ci_id}")
        self._put_handle(out, "ci", gpu.index, gi.id, ci_id)

    @nvml(P, P)
    def nvmlComputeInstanceGetInfo_v2(self, handle, ptr):
        _, gpu, gi, ci = self._ci(handle)
        info = struct(ptr, N.c_nvmlComputeInstanceInfo_t)
        put(ptr, c_void_p, self._handle("gpu", gpu.index))
        put(ptr + sizeof(c_void_p), c_void_p, self._handle("gi", gpu.index, gi.id))
        info.id, info.profileId = ci.id, ci.profile_id
        info.placement.start, info.placement.size = ci.start, ci.size

    @nvml(P)
    def nvmlComputeInstanceDestroy(self, handle):
        _, gpu, gi, ci = self._ci(handle)
        self._configuring("destroying a compute instance")
        self._mutate(lambda s: s.destroy_ci(gpu.index, gi.id, ci.id))

    # ---- telemetry (sensor values from sim.telemetry) -------------------------------

    def _sensors(self, handle):
        """(state, gpu, reading) for a physical GPU; MIG device handles get NOT_SUPPORTED."""
        state, gpu, mig = self._device(handle)
        if mig is not None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "not supported on a MIG device")
        t = time.time()
        reading = telemetry.read_sensors(self._sku(gpu), gpu.uuid, len(state.processes_on(gpu.index)),
                                         t, self._booted_at(state))
        return state, gpu, reading

    def _booted_at(self, state) -> float:
        return state.booted_at or (self.store.dir / "node.json").stat().st_mtime

    def _whole_gpu_only(self, handle):
        """Utilisation queries: not on MIG devices, nor on a GPU with MIG enabled (nvml.h)."""
        state, gpu, reading = self._sensors(handle)
        if gpu.mig_current == MIG_ENABLE:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "not supported with MIG enabled")
        return reading

    @nvml(P, P)
    def nvmlDeviceGetUtilizationRates(self, handle, ptr):
        reading = self._whole_gpu_only(handle)
        util = struct(ptr, N.c_nvmlUtilization_t)
        util.gpu, util.memory = reading.gpu_util, reading.mem_util

    @nvml(P, P, P)
    def nvmlDeviceGetEncoderUtilization(self, handle, util, period_us):
        reading = self._whole_gpu_only(handle)
        put(util, c_uint, reading.enc_util)
        put(period_us, c_uint, 1_000_000)

    @nvml(P, P, P)
    def nvmlDeviceGetDecoderUtilization(self, handle, util, period_us):
        reading = self._whole_gpu_only(handle)
        put(util, c_uint, reading.dec_util)
        put(period_us, c_uint, 1_000_000)

    @nvml(P, c_uint, P)
    def nvmlDeviceGetTemperature(self, handle, sensor, ptr):
        if sensor != N.NVML_TEMPERATURE_GPU:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad sensor {sensor}")
        put(ptr, c_uint, self._sensors(handle)[2].gpu_temp_c)

    @nvml(P, c_int, P)
    def nvmlDeviceGetFieldValues(self, handle, count, values):
        # Per-entry results, as NVML gives: the call succeeds, unknown fields say NOT_SUPPORTED.
        state, gpu, mig = self._device(handle)
        reading = None if mig else self._sensors(handle)[2]
        now_us = int(time.time() * 1e6)
        for i in range(count):
            fv = N.c_nvmlFieldValue_t.from_address(values + i * sizeof(N.c_nvmlFieldValue_t))
            fv.timestamp, fv.latencyUsec = now_us, 0
            if (fv.fieldId == N.NVML_FI_DEV_MEMORY_TEMP and reading is not None
                    and telemetry.has_hbm(self._sku(gpu))):
                fv.valueType, fv.nvmlReturn = N.NVML_VALUE_TYPE_UNSIGNED_INT, N.NVML_SUCCESS
                fv.value.uiVal = reading.mem_temp_c
            elif fv.fieldId == N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION and reading is not None:
                # the counter nvmlDeviceGetTotalEnergyConsumption reads (nvml.h: mJ since the
                # driver was last reloaded)
                fv.valueType, fv.nvmlReturn = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, N.NVML_SUCCESS
                fv.value.ullVal = self._energy_mj(state, gpu, reading)
            elif fv.fieldId == N.NVML_FI_DEV_PCIE_REPLAY_COUNTER and reading is not None:
                fv.valueType, fv.nvmlReturn = N.NVML_VALUE_TYPE_UNSIGNED_INT, N.NVML_SUCCESS
                fv.value.uiVal = reading.pcie_replays
            elif fv.fieldId in FIELDS:
                FIELDS[fv.fieldId](self, state, gpu, mig, fv)
            else:
                fv.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED

    @nvml(P, P)
    def nvmlDeviceGetPowerUsage(self, handle, ptr):
        put(ptr, c_uint, self._sensors(handle)[2].power_mw)

    @nvml(P, P)
    def nvmlDeviceGetTotalEnergyConsumption(self, handle, ptr):
        put(ptr, c_ulonglong, self._energy_mj(*self._sensors(handle)))

    def _energy_mj(self, state, gpu, reading) -> int:
        # The counter integrates the power this process has seen since its first read,
        # starting from the idle power over the time since boot: monotonic and consistent
        # with nvmlDeviceGetPowerUsage, though two processes may read different totals.
        boot, t = self._booted_at(state), time.time()
        last = self._energy.get(gpu.index)
        if last is None or last[0] != boot:
            energy = telemetry.idle_power_mw(self._sku(gpu)) * max(0.0, t - boot)
        else:
            energy = last[2] + reading.power_mw * max(0.0, t - last[1])
        self._energy[gpu.index] = (boot, t, energy)
        return int(energy)

    @nvml(P, c_uint, P)
    def nvmlDeviceGetClockInfo(self, handle, clock_type, ptr):
        reading = self._sensors(handle)[2]
        clocks = {N.NVML_CLOCK_GRAPHICS: reading.sm_clock_mhz, N.NVML_CLOCK_SM: reading.sm_clock_mhz,
                  N.NVML_CLOCK_MEM: reading.mem_clock_mhz, N.NVML_CLOCK_VIDEO: reading.sm_clock_mhz * 9 // 10}
        if clock_type not in clocks:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad clock type {clock_type}")
        put(ptr, c_uint, clocks[clock_type])

    @nvml(P, P)
    def nvmlDeviceGetPcieReplayCounter(self, handle, ptr):
        put(ptr, c_uint, self._sensors(handle)[2].pcie_replays)

    @nvml(P, P, P, P, P)
    def nvmlDeviceGetRemappedRows(self, handle, corr, unc, pending, failure):
        _, gpu, reading = self._sensors(handle)
        # nvml.h: Ampere or newer; not on MIG-enabled GPUs with active instances.
        if self._sku(gpu).nvml_architecture < ARCHITECTURES["ampere"]:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "row remapping needs Ampere or newer")
        if gpu.mig_current == MIG_ENABLE and gpu.gis:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "MIG instances are active")
        put(corr, c_uint, reading.remapped_correctable)
        put(unc, c_uint, 0)
        put(pending, c_uint, 0)
        put(failure, c_uint, 0)

    # ---- events --------------------------------------------------------------------

    @nvml(P)
    def nvmlEventSetCreate(self, out):
        n, self._next_event_set = self._next_event_set, self._next_event_set + 1
        self._event_sets[n] = {"regs": {}, "cursor": self._state().next_seq - 1}
        self._put_handle(out, "eventset", n)

    def _event_set(self, handle) -> dict:
        key = self._key(handle)
        if key[0] != "eventset" or key[1] not in self._event_sets:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "not an event set")
        return self._event_sets[key[1]]

    @nvml(P, P)
    def nvmlDeviceGetSupportedEventTypes(self, handle, ptr):
        self._gpu_only(handle)
        put(ptr, c_ulonglong, SUPPORTED_EVENTS)

    @nvml(P, c_ulonglong, P)
    def nvmlDeviceRegisterEvents(self, handle, types, event_set):
        _, gpu = self._gpu_only(handle)
        if types & ~SUPPORTED_EVENTS:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "unsupported event types")
        if not gpu.events_supported:
            # The supported-types mask still lists them: the case masking does not catch.
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "event registration not supported")
        regs = self._event_set(event_set)["regs"]
        regs[gpu.index] = regs.get(gpu.index, 0) | types

    @nvml(P, P, c_uint)
    def nvmlEventSetWait_v2(self, event_set, data_ptr, timeout_ms):
        es = self._event_set(event_set)
        deadline = time.monotonic() + timeout_ms / 1000
        # nvml.h: on a MIG-enabled GPU, events of single instances reach only callers with
        # the privilege; others get "only the events which affect ... (whole device)".
        whole_only = not privilege.can_monitor(self.store.root)
        while True:
            state = self._state()
            for ev in state.events:
                if whole_only and ev.gi != 0xFFFFFFFF and state.gpus[ev.gpu].mig_current == MIG_ENABLE:
                    continue
                if ev.seq > es["cursor"] and es["regs"].get(ev.gpu, 0) & ev.event_type:
                    es["cursor"] = ev.seq
                    es["pause"] = _WAIT_POLL_MIN         # more may follow closely
                    data = struct(data_ptr, N.c_nvmlEventData_t)
                    put(data_ptr, c_void_p, self._handle("gpu", ev.gpu))
                    data.eventType, data.eventData = ev.event_type, ev.data
                    data.gpuInstanceId, data.computeInstanceId = ev.gi, ev.ci
                    return
            es["cursor"] = max(es["cursor"], state.next_seq - 1)
            if any(state.gpus[i].lost for i in es["regs"]):
                raise SimNvmlError(N.NVML_ERROR_GPU_IS_LOST, "a registered GPU is lost")
            if time.monotonic() >= deadline:
                raise SimNvmlError(N.NVML_ERROR_TIMEOUT, "no event")
            pause = es.get("pause", _WAIT_POLL_MIN)
            es["pause"] = min(pause * 2, _WAIT_POLL_MAX)
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))

    @nvml(P)
    def nvmlEventSetFree(self, event_set):
        self._event_set(event_set)
        del self._event_sets[self._key(event_set)[1]]


def install(root) -> FakeNvmlLibrary:
    """Put a fake library for the node at ``root`` beneath pynvml."""
    with N.libLoadLock:
        _close_previous()
        lib = FakeNvmlLibrary(SimStore(root))
        N.nvmlLib = lib
        N._nvmlGetFunctionPointer_cache.clear()
    return lib


def _close_previous() -> None:
    """The library being replaced lets go of its node's GPUs: this process no longer talks
    to that node through it."""
    previous = N.nvmlLib
    if isinstance(previous, FakeNvmlLibrary):
        previous.close_gpus()


def uninstall() -> None:
    with N.libLoadLock:
        _close_previous()
        N.nvmlLib = None
        N._nvmlGetFunctionPointer_cache.clear()

