"""The simulated node's state and the driver's MIG rules, independent of storage and ctypes.

Every operation either succeeds and mutates the state, or raises ``SimNvmlError`` with the
NVML return code the real driver gives for that case and leaves the state unchanged.
"""

from __future__ import annotations

import hashlib
import time
import uuid as uuidlib
from dataclasses import dataclass, field, fields, is_dataclass

import pynvml as N

from .catalog import GiProfileSpec, SkuSpec, sku_from_dict
from .topology import SimTopology

__all__ = ["SimNvmlError", "ComputeInstance", "GpuInstance", "SimGpu", "SimProcess",
           "SimEvent", "NodeFacts", "NodeState", "gpu_instance_id"]

MIG_DISABLE, MIG_ENABLE = N.NVML_DEVICE_MIG_DISABLE, N.NVML_DEVICE_MIG_ENABLE
XID_FALLEN_OFF_BUS = 79


class SimNvmlError(Exception):
    def __init__(self, code: int, why: str = ""):
        super().__init__(f"NVML error {code}: {why}")
        self.code = code


def gpu_instance_id(start: int, size: int, memory_slices: int, shuffle: str | None = None) -> int:
    """The id the driver gives a GPU instance placed at ``start:size``.

    Ids come from the binary tree of memory slices: the whole GPU 0, halves 1-2, quarters
    3-6, eighths 7-14 on an 8-slice GPU (A30: 0, 1-2, 3-6). In the MIG user guide's
    examples 2 and 3 and a published A30 session the id is the placement's own slot
    (``0:1`` is 7 on A100, ``2:2`` is 2 on A30). Other listings show other ids for the same
    placements: the guide's first ``-lgi`` lists GI 1 at 4:4 and GI 2 at 0:4, and three
    2g.20gb instances on one GPU of an R510 host are GIs 3, 5 and 6 (nvitop PR #8), where
    6 is no 2g placement's slot. With ``shuffle`` (a seed) the slots of each size map to
    the ids of that size in a seeded order instead, so ids stay distinct and in their range
    but cannot be told from placements.
    """
    count = memory_slices // size
    slot = start // size
    if shuffle is not None:
        order = sorted(range(count), key=lambda k: hashlib.sha256(f"{shuffle}/{size}/{k}".encode()).digest())
        slot = order[slot]
    return count - 1 + slot


@dataclass
class ComputeInstance:
    id: int
    profile_id: int
    start: int
    size: int
    uuid: str


@dataclass
class GpuInstance:
    id: int
    profile_id: int
    start: int
    size: int
    cis: list[ComputeInstance] = field(default_factory=list)

    def ci(self, ci_id: int) -> ComputeInstance | None:
        return next((c for c in self.cis if c.id == ci_id), None)


@dataclass
class SimGpu:
    index: int
    sku: str
    uuid: str
    pci_bus_id: str          # "0000:07:00.0"
    minor: int
    serial: str
    mig_current: int = MIG_DISABLE
    mig_pending: int = MIG_DISABLE
    lost: bool = False
    gis: list[GpuInstance] = field(default_factory=list)
    # False: nvmlDeviceRegisterEvents answers NOT_SUPPORTED, as the device plugin met on
    # older boards (its v0.19.0 "Fix healthchecking on old devices").
    events_supported: bool = True
    # A GPU passed through to a VM that cannot reset it: a MIG mode change that needs a
    # reset answers activation status RESET_REQUIRED and waits for a reboot (mig.md 1.5, 4).
    passthrough: bool = False
    # How the driver numbers this GPU's instances (see gpu_instance_id): "placement", or
    # "shuffled" (seeded by the UUID), as published listings show on a host's other GPUs.
    gi_ids: str = "placement"
    # False: NVML's topology calls on it answer NOT_SUPPORTED, as on a virtual GPU.
    topology: bool = True
    # nvmlComputeMode_t; nvml.h: "Under Linux it is not persistent across reboots and always
    # resets to 'Default'" (a driver reload too: the setting lives in the loaded driver).
    compute_mode: int = N.NVML_COMPUTEMODE_DEFAULT
    # nvidia-smi compute-policy --set-timeslice: 0 Default, 1 Short, 2 Medium, 3 Long. No NVML
    # call reads or sets it (the DRA driver runs nvidia-smi for it); kept beside the mode,
    # which it shares the persistence of (the simulator's choice: no source says).
    timeslice: int = 0
    # A vGPU guest's GPU (a VM's virtual GPU): its licence, "licensed" or "unlicensed"; None
    # for a bare-metal GPU (sim/vgpu.py). No verb sets it; tests set it through the store.
    vgpu_license: str | None = None
    # The kernel driver its PCI function is bound to (sim/pcibus.py): "nvidia" (the GPU
    # driver the loaded module set manages), "vfio-pci", or "" (none). NVML sees only GPUs
    # the nvidia driver holds.
    driver: str = "nvidia"
    driver_override: str = ""      # sysfs driver_override ("" shows as "(null)")
    unbind_lock: bool = False      # /proc/driver/nvidia/gpus/<bdf>/unbindLock acquired
    # Persistence: the legacy per-GPU flag (nvmlDeviceSetPersistenceMode), and whether
    # nvidia-persistenced let go of the GPU (nvidia-smi -pm 0 through its socket, or the GPU
    # left the nvidia driver: the daemon does not take back a GPU probed after its start).
    persistence: bool = False
    persistenced_released: bool = False

    @property
    def on_nvidia(self) -> bool:
        return self.driver == "nvidia"

    def gi(self, gi_id: int) -> GpuInstance | None:
        return next((g for g in self.gis if g.id == gi_id), None)


@dataclass
class SimProcess:
    pid: int
    gpu: int
    gi: int | None = None
    ci: int | None = None
    name: str = "cuda-app"
    used_mib: int = 512
    spawned: bool = False    # started by the simulator, so it may stop it


@dataclass
class SimEvent:
    seq: int
    gpu: int
    event_type: int
    data: int
    gi: int = 0xFFFFFFFF     # NVML reports "not applicable" as all ones
    ci: int = 0xFFFFFFFF


@dataclass(frozen=True)
class NodeFacts:
    """The static half: what the node is. Written once at creation."""
    profile: str
    driver_version: str
    cuda_driver_version: int
    skus: dict[str, SkuSpec]
    real_device_nodes: bool
    majors: dict[str, int]
    nvswitches: int = 0          # NVSwitch chips (HGX baseboards); 0: GPUs not fabric-attached
    topology: SimTopology | None = None   # None: a node made before the simulator had one
    # PCI functions beside the GPUs (a GPU's HD-audio function): bdf -> {vendor, device,
    # class, gpu (its GPU's index), name}; and every function's IOMMU group: bdf -> number.
    functions: dict = field(default_factory=dict)
    iommu_groups: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict) -> "NodeFacts":
        return cls(profile=raw["profile"], driver_version=raw["driver_version"],
                   cuda_driver_version=raw["cuda_driver_version"],
                   skus={k: sku_from_dict(k, v, raw["driver_version"]) for k, v in raw["skus"].items()},
                   real_device_nodes=raw["real_device_nodes"], majors=raw["majors"],
                   nvswitches=raw.get("nvswitches", 0),
                   topology=SimTopology.from_dict(raw["topology"]) if raw.get("topology") else None,
                   functions=raw.get("functions", {}), iommu_groups=raw.get("iommu_groups", {}))


@dataclass
class NodeState:
    """The dynamic half: modes, instances, processes, events."""
    gpus: list[SimGpu]
    processes: list[SimProcess] = field(default_factory=list)
    events: list[SimEvent] = field(default_factory=list)
    next_seq: int = 1
    boots: int = 0
    driver_loaded: bool = True
    booted_at: float = field(default_factory=time.time)   # counters such as energy start here
    # The driver's kernel side (sim/kmod.py, sim/faults.py): module_version and flavour of
    # the loaded module (absent: the node's driver_version), nouveau (loaded instead),
    # fabric_manager (False: stopped).
    driver: dict = field(default_factory=dict)
    # Simulated workloads (sim/workload.py): device UUID -> {"load": {...}, "since": time set}.
    # They end with the driver (a reboot, an unload), as the programs behind them would.
    loads: dict = field(default_factory=dict)
    # The PCI functions beside the GPUs: bdf -> {"driver": ..., "override": ...} (sim/pcibus.py).
    functions: dict = field(default_factory=dict)
    # The kernel's VFIO side (sim/pcibus.py): iommu (on: the kernel command line enabled it),
    # iommufd (/dev/iommu and the VFIO device cdevs), vfio_pci (the module is loaded),
    # vfio_ids (vfio-pci's dynamic ids, new_id), cdevs (bdf -> N of /dev/vfio/devices/vfioN).
    kernel: dict = field(default_factory=lambda: {"iommu": True, "iommufd": False, "vfio_pci": False,
                                                  "vfio_ids": [], "cdevs": {}})

    MAX_EVENTS = 1000

    # ---- (de)serialisation ---------------------------------------------------------

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "NodeState":
        gpus = []
        for g in raw["gpus"]:
            gis = [GpuInstance(**{**gi, "cis": [ComputeInstance(**c) for c in gi["cis"]]})
                   for gi in g["gis"]]
            gpus.append(SimGpu(**{**g, "gis": gis}))
        return cls(gpus=gpus, processes=[SimProcess(**p) for p in raw["processes"]],
                   events=[SimEvent(**e) for e in raw["events"]],
                   next_seq=raw["next_seq"], boots=raw["boots"],
                   driver_loaded=raw.get("driver_loaded", True),
                   booted_at=raw.get("booted_at", 0.0), driver=raw.get("driver", {}),
                   loads=raw.get("loads", {}), functions=raw.get("functions", {}),
                   kernel=raw.get("kernel") or {"iommu": False, "iommufd": False, "vfio_pci": False,
                                                "vfio_ids": [], "cdevs": {}})

    # ---- lookups -------------------------------------------------------------------

    def gpu(self, index: int) -> SimGpu:
        if not 0 <= index < len(self.gpus):
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"no GPU {index}")
        return self.gpus[index]

    def nvml_gpus(self) -> list[SimGpu]:
        """The GPUs NVML lists, in its index order: those the nvidia driver holds, in PCI
        order. nvml.h numbers devices 0 to nvmlDeviceGetCount()-1, so a GPU bound to another
        driver moves the indices of the GPUs after it down; its minor stays the driver's."""
        if not self.driver_loaded or self.driver.get("nouveau"):
            return []
        return [g for g in self.gpus if g.on_nvidia]

    def live_gpu(self, index: int) -> SimGpu:
        gpu = self.gpu(index)
        if gpu.lost:
            raise SimNvmlError(N.NVML_ERROR_GPU_IS_LOST, f"GPU {index} is lost")
        return gpu

    def processes_on(self, gpu: int, gi: int | None = None, ci: int | None = None):
        return [p for p in self.processes if p.gpu == gpu
                and (gi is None or p.gi == gi) and (ci is None or p.ci == ci)]

    # ---- MIG mode ------------------------------------------------------------------

    def set_mig_mode(self, facts: NodeFacts, index: int, mode: int,
                     clients: tuple[str, ...] = ()) -> int:
        """Returns the activation status, as nvmlDeviceSetMigMode does. ``clients``: the
        driver clients (such as nvidia-persistenced) holding the node's GPUs open."""
        gpu = self.live_gpu(index)
        sku = facts.skus[gpu.sku]
        if sku.mig is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "GPU is not MIG capable")
        if mode not in (MIG_DISABLE, MIG_ENABLE):
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad MIG mode {mode}")
        if mode == MIG_DISABLE and gpu.gis:
            raise SimNvmlError(N.NVML_ERROR_IN_USE, "GPU instances exist")
        gpu.mig_pending = mode
        if gpu.mig_current == mode:
            return N.NVML_SUCCESS
        if sku.mig_mode_persists:
            # Ampere: the driver resets the GPU itself ("may unbind or reset the device",
            # nvml.h), so an idle GPU switches at once (the MIG user guide's "Enabled MIG Mode
            # for GPU ..."). A process or a driver client (persistenced, nvsm, dcgm) makes the
            # reset fail and the mode waits in InfoROM for a GPU reset or a reboot; a VM that
            # cannot reset its passed-through GPU needs a reboot.
            if gpu.passthrough:
                return N.NVML_ERROR_RESET_REQUIRED
            if clients:
                return N.NVML_ERROR_IN_USE
        if self.processes_on(index):
            return N.NVML_ERROR_IN_USE
        gpu.mig_current = mode
        return N.NVML_SUCCESS

    # ---- compute mode ----------------------------------------------------------------

    COMPUTE_MODES = (N.NVML_COMPUTEMODE_DEFAULT, N.NVML_COMPUTEMODE_PROHIBITED,
                     N.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)

    def set_compute_mode(self, index: int, mode: int) -> None:
        """nvmlDeviceSetComputeMode. EXCLUSIVE_THREAD is "Support Removed" (nvml.h), so it
        is an invalid argument, as any value outside the enum."""
        gpu = self.live_gpu(index)
        if mode not in self.COMPUTE_MODES:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"bad compute mode {mode}")
        gpu.compute_mode = mode

    def context_refusal(self, index: int, pid: int, gi: int | None = None, ci: int | None = None) -> str | None:
        """Why process ``pid`` may not create a CUDA context on GPU ``index`` (or its MIG
        device ``gi``/``ci``, each a device of its own to CUDA) now, as CUDA's
        compute modes say (cudaComputeMode: PROHIBITED "No contexts can be created on this
        device at this time", EXCLUSIVE_PROCESS "Only one context used by a single process
        can be present on this device at a time"); None if it may. The text is CUDA's
        cudaErrorDevicesUnavailable."""
        gpu = self.gpu(index)
        others = [p for p in self.processes_on(index, gi, ci) if p.pid != pid]
        if gpu.compute_mode == N.NVML_COMPUTEMODE_PROHIBITED or (
                gpu.compute_mode == N.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS and others):
            return "all CUDA-capable devices are busy or unavailable"
        return None

    def reset_gpu(self, index: int) -> None:
        """A GPU reset (nvidia-smi -r): pending mode takes effect, instances vanish."""
        gpu = self.live_gpu(index)
        if self.processes_on(index):
            raise SimNvmlError(N.NVML_ERROR_IN_USE, "in use by another client")
        gpu.mig_current = gpu.mig_pending
        gpu.gis.clear()

    def reboot(self, facts: NodeFacts) -> list[SimProcess]:
        """Returns the processes that held GPUs (they do not survive a reboot). The driver
        is loaded at boot, whatever it was before."""
        gone, self.processes = self.processes, []
        for gpu in self.gpus:
            gpu.gis.clear()
            gpu.lost = False
            gpu.compute_mode, gpu.timeslice = N.NVML_COMPUTEMODE_DEFAULT, 0
            # Bindings and driver_override live in the running kernel: every GPU is probed
            # by nvidia again, and vfio-pci is not loaded until someone loads it.
            gpu.driver, gpu.driver_override, gpu.unbind_lock = "nvidia", "", False
            gpu.persistence = gpu.persistenced_released = False
            if facts.skus[gpu.sku].mig_mode_persists:
                gpu.mig_current = gpu.mig_pending
            else:
                gpu.mig_current = gpu.mig_pending = MIG_DISABLE
        self.events.clear()
        self.loads.clear()
        self.functions = {}
        self.kernel.update(vfio_pci=False, vfio_ids=[], cdevs={})
        self.driver_loaded = True
        self.boots += 1
        self.booted_at = time.time()
        return gone

    def unload_driver(self, facts: NodeFacts) -> None:
        """The kernel module goes: MIG instances never survive it (MIG user guide), and
        Hopper and newer lose MIG mode with it (mode lives in the driver, not InfoROM).
        Ampere keeps its current and pending mode: no documentation says a reload resets
        the GPU, so a pending change still waits for a reset or reboot."""
        if self.processes:
            raise SimNvmlError(N.NVML_ERROR_IN_USE, "processes hold GPUs")
        for gpu in self.gpus:
            gpu.gis.clear()
            gpu.compute_mode, gpu.timeslice = N.NVML_COMPUTEMODE_DEFAULT, 0
            if not facts.skus[gpu.sku].mig_mode_persists:
                gpu.mig_current = gpu.mig_pending = MIG_DISABLE
        self.loads.clear()
        self.driver_loaded = False

    # ---- GPU instances -------------------------------------------------------------

    def _mig_gpu(self, facts: NodeFacts, index: int) -> tuple[SimGpu, SkuSpec]:
        gpu = self.live_gpu(index)
        sku = facts.skus[gpu.sku]
        if sku.mig is None or gpu.mig_current != MIG_ENABLE:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED, "MIG mode is not enabled")
        return gpu, sku

    def gi_profile(self, facts: NodeFacts, index: int, profile_id: int) -> GiProfileSpec:
        sku = facts.skus[self.live_gpu(index).sku]
        prof = sku.mig.by_id(profile_id) if sku.mig else None
        if prof is None:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"no GI profile id {profile_id}")
        return prof

    def gi_capacity_error(self, facts: NodeFacts, index: int, prof: GiProfileSpec) -> str | None:
        """Why one more GI of ``prof`` cannot exist, ignoring placement; None if it can."""
        gpu = self.gpus[index]
        mig = facts.skus[gpu.sku].mig
        profiles = [mig.by_id(g.profile_id) for g in gpu.gis]
        if sum(p.id == prof.id for p in profiles) >= prof.instances:
            return "instance count exhausted"
        if sum(p.slices for p in profiles) + prof.slices > mig.compute_slices:
            return "compute slices exhausted"
        full = mig.full
        for engine in ("decoders", "encoders", "jpegs", "ofas"):
            if sum(getattr(p, engine) for p in profiles) + getattr(prof, engine) > getattr(full, engine):
                return f"{engine} exhausted"
        if prof.all_media and any(not p.no_media for p in profiles):
            return "+me.all needs every other instance to be -me"
        if any(p.all_media for p in profiles) and not prof.no_media:
            return "a +me.all instance allows only -me instances"
        return None

    def free_placements(self, facts: NodeFacts, index: int, prof: GiProfileSpec) -> list[int]:
        gpu = self.gpus[index]
        used = {s for g in gpu.gis for s in range(g.start, g.start + g.size)}
        return [s for s in prof.placements
                if used.isdisjoint(range(s, s + prof.memory_slices))]

    def gi_remaining(self, facts: NodeFacts, index: int, prof: GiProfileSpec) -> int:
        """How many more GIs of ``prof`` fit, placed one after another (RemainingCapacity)."""
        if self.gi_capacity_error(facts, index, prof):
            return 0
        taken: set[int] = set()
        fits = 0
        for start in self.free_placements(facts, index, prof):
            if taken.isdisjoint(range(start, start + prof.memory_slices)):
                taken.update(range(start, start + prof.memory_slices))
                fits += 1
        used = sum(g.profile_id == prof.id for g in self.gpus[index].gis)
        return min(fits, prof.instances - used)

    def create_gi(self, facts: NodeFacts, index: int, profile_id: int,
                  placement: tuple[int, int] | None = None) -> GpuInstance:
        gpu, sku = self._mig_gpu(facts, index)
        prof = self.gi_profile(facts, index, profile_id)
        if placement is not None:
            start, size = placement
            if size != prof.memory_slices or start not in prof.placements:
                raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT,
                                   f"placement {start}:{size} is not valid for {prof.name}")
        why = self.gi_capacity_error(facts, index, prof)
        if why:
            raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_RESOURCES, why)
        free = self.free_placements(facts, index, prof)
        if placement is None:
            if not free:
                raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_RESOURCES, "no free placement")
            start = _driver_placement(sku.mig, {s for g in gpu.gis for s in range(g.start, g.start + g.size)},
                                      prof, free)
        elif placement[0] not in free:
            raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_RESOURCES,
                               f"placement {placement[0]}:{placement[1]} overlaps an instance")
        shuffle = gpu.uuid if gpu.gi_ids == "shuffled" else None
        gi = GpuInstance(id=gpu_instance_id(start, prof.memory_slices, sku.mig.memory_slices, shuffle),
                         profile_id=prof.id, start=start, size=prof.memory_slices)
        gpu.gis.append(gi)
        gpu.gis.sort(key=lambda g: g.id)
        return gi

    def find_gi(self, index: int, gi_id: int) -> tuple[SimGpu, GpuInstance]:
        gpu = self.live_gpu(index)
        gi = gpu.gi(gi_id)
        if gi is None:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"GPU instance {gi_id} does not exist")
        return gpu, gi

    def destroy_gi(self, index: int, gi_id: int) -> None:
        gpu, gi = self.find_gi(index, gi_id)
        if gi.cis or self.processes_on(index, gi_id):
            raise SimNvmlError(N.NVML_ERROR_IN_USE, "compute instances or processes are active")
        gpu.gis.remove(gi)

    # ---- compute instances ---------------------------------------------------------

    def create_ci(self, facts: NodeFacts, index: int, gi_id: int, profile_id: int,
                  placement: tuple[int, int] | None = None) -> ComputeInstance:
        gpu, gi = self.find_gi(index, gi_id)
        gprof = facts.skus[gpu.sku].mig.by_id(gi.profile_id)
        cprof = gprof.ci_profile(profile_id)
        if cprof is None:
            raise SimNvmlError(N.NVML_ERROR_NOT_SUPPORTED,
                               f"CI profile {profile_id} does not fit a {gprof.name} instance")
        # A malformed placement is a bad argument whatever is free, as for GPU instances.
        if placement is not None and (placement[1] != cprof.slices
                                      or placement[0] not in cprof.placements):
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT,
                               f"placement {placement[0]}:{placement[1]} is not valid for this CI profile")
        if sum(c.profile_id == profile_id for c in gi.cis) >= cprof.instances:
            raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_RESOURCES, "instance count exhausted")
        if sum(c.size for c in gi.cis) + cprof.slices > gprof.slices:
            raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_RESOURCES, "compute slices exhausted")
        used = {s for c in gi.cis for s in range(c.start, c.start + c.size)}
        free = [s for s in cprof.placements if used.isdisjoint(range(s, s + cprof.slices))]
        if placement is not None:
            start = placement[0]
            if start not in free:
                raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_RESOURCES, "placement overlaps")
        elif not free:
            raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_RESOURCES, "no free placement")
        else:
            start = min(free)
        ids = {c.id for c in gi.cis}
        ci_id = next(i for i in range(len(ids) + 1) if i not in ids)
        ci = ComputeInstance(id=ci_id, profile_id=profile_id, start=start, size=cprof.slices,
                             uuid=mig_uuid(gpu.uuid, gi, ci_id))
        gi.cis.append(ci)
        gi.cis.sort(key=lambda c: c.id)
        return ci

    def find_ci(self, index: int, gi_id: int, ci_id: int):
        gpu, gi = self.find_gi(index, gi_id)
        ci = gi.ci(ci_id)
        if ci is None:
            raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"compute instance {ci_id} does not exist")
        return gpu, gi, ci

    def destroy_ci(self, index: int, gi_id: int, ci_id: int) -> None:
        _, gi, ci = self.find_ci(index, gi_id, ci_id)
        if self.processes_on(index, gi_id, ci_id):
            raise SimNvmlError(N.NVML_ERROR_IN_USE, "processes are active")
        gi.cis.remove(ci)

    # ---- MIG devices (one per CI) --------------------------------------------------

    def mig_devices(self, index: int) -> dict[int, tuple[GpuInstance, ComputeInstance]]:
        """The GPU's MIG devices by MIG device index: numbered densely from 0 in GPU then
        compute instance id order, renumbered as instances come and go (docs/simulator.md,
        "MIG device indices")."""
        gpu = self.gpus[index]
        pairs = sorted(((gi, ci) for gi in gpu.gis for ci in gi.cis), key=lambda p: (p[0].id, p[1].id))
        return dict(enumerate(pairs))

    # ---- processes and events ------------------------------------------------------

    def add_event(self, gpu: int, event_type: int, data: int,
                  gi: int | None = None, ci: int | None = None) -> SimEvent:
        self.gpu(gpu)
        ev = SimEvent(seq=self.next_seq, gpu=gpu, event_type=event_type, data=data,
                      gi=0xFFFFFFFF if gi is None else gi, ci=0xFFFFFFFF if ci is None else ci)
        self.next_seq += 1
        self.events.append(ev)
        del self.events[:-self.MAX_EVENTS]
        return ev

    def mark_lost(self, index: int) -> None:
        gpu = self.gpu(index)
        self.add_event(index, N.nvmlEventTypeXidCriticalError, XID_FALLEN_OFF_BUS)
        gpu.lost = True


def _driver_placement(mig, used: set[int], prof: GiProfileSpec, free: list[int]) -> int:
    """Where the driver puts a GPU instance created without a placement: at the free start
    that leaves the most placements of all profiles open, the lowest of equals. This gives
    every published choice: the MIG user guide's 1g,1g,2g at 6:1, 4:1, 0:2 (3g then fails),
    3g,1g,2g,1g at 4:4, 0:1, 2:2, 1:1, 2g then five 1g at 4:2, 6:1, 0:1 to 3:1, 4g,2g,1g at
    0:4, 4:2, 6:1, and an A30 session's 1g,1g,2g at 0:1, 1:1, 2:2 (docs/simulator.md)."""
    def still_open(start: int) -> int:
        taken = used | set(range(start, start + prof.memory_slices))
        return sum(taken.isdisjoint(range(s, s + p.memory_slices))
                   for p in mig.gi_profiles for s in p.placements)
    return max(free, key=lambda s: (still_open(s), -s))


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_LEAVES = frozenset({int, float, str, bool, type(None)})


def _plain(obj):
    """``dataclasses.asdict`` without its deep copy of every leaf, which made serialising
    the state the largest cost of a simulated NVML mutation; the leaves here are immutable."""
    kind = type(obj)
    if kind in _LEAVES:
        return obj
    names = _FIELD_NAMES.get(kind)
    if names is None:
        if isinstance(obj, (list, tuple)):
            return [_plain(v) for v in obj]
        if isinstance(obj, dict):
            return {k: _plain(v) for k, v in obj.items()}
        if not is_dataclass(obj):
            return obj
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(obj))
    return {name: _plain(getattr(obj, name)) for name in names}


def mig_uuid(gpu_uuid: str, gi: GpuInstance, ci_id: int) -> str:
    """A stable opaque MIG UUID (R470+ format) for a GI/CI at its placement."""
    key = f"{gpu_uuid}/{gi.id}/{gi.profile_id}/{gi.start}/{ci_id}"
    return f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, key)}"
