"""The inventory's records: plain, immutable facts about the node's GPUs.

Facts a device cannot have are absent (``mig`` is None on a GPU without MIG), not guessed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Placement", "MigProfile", "ComputeInstance", "GpuInstance", "MigDevice",
           "MigState", "Gpu", "UnreadableGpu", "Unread", "Inventory", "GpuProcess", "sysfs_bus_id",
           "GpuTopology", "GpuLink", "Topology", "PCIE_LEVELS", "UNKNOWN"]


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's bus id ("00000000:07:00.0") as /sys and /proc spell it: "0000:07:00.0"."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


@dataclass(frozen=True, order=True)
class Placement:
    start: int
    size: int

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"

    def overlaps(self, other: "Placement") -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


# hostagent.devices.read_inventory() -> Gpu.mig.profiles
@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile as this GPU reports it."""
    index: int                 # NVML_GPU_INSTANCE_PROFILE_* value used to query it
    id: int                    # nvmlGpuInstanceProfileInfo.id, used by every other call
    name: str                  # "1g.5gb", "1g.5gb+me", ...
    slices: int                # compute slices
    instances: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placements: tuple[Placement, ...]

    @property
    def memory_slices(self) -> int:
        return self.placements[0].size if self.placements else 0


# hostagent.devices.read_inventory() -> GpuInstance.compute_instances
@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile_id: int
    slices: int
    placement: Placement


# hostagent.devices.read_inventory() -> Gpu.mig.gpu_instances
@dataclass(frozen=True)
class GpuInstance:
    id: int
    profile_id: int
    profile: str
    placement: Placement
    compute_instances: tuple[ComputeInstance, ...]


# hostagent.devices.read_inventory() -> Gpu.mig.devices
@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance) as CUDA and containers see it."""
    uuid: str
    parent_index: int
    parent_uuid: str
    parent_minor: int
    index: int                 # NVML MIG device index on the parent (dense, in GI/CI id order)
    gi: int
    ci: int
    profile: str               # "1g.5gb", or "1c.3g.20gb" for a CI smaller than its GI
    gi_profile_id: int | None  # None: no profile matched (see Unread)
    ci_profile_id: int
    # The GPU instance's placement on the memory-slice axis and the compute instance's inside
    # it; None where NVML would not list the instances to this process (Inventory.unread).
    placement: Placement | None
    ci_placement: Placement | None
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int

    @property
    def name(self) -> str:
        """The ``<gpu>:<mig>`` name CDI and NVIDIA_VISIBLE_DEVICES use for MIG devices."""
        return f"{self.parent_index}:{self.index}"


@dataclass(frozen=True)
class MigState:
    enabled: bool              # current mode
    pending: bool              # mode after the next reset (or reboot, on Ampere)
    profiles: tuple[MigProfile, ...]
    gpu_instances: tuple[GpuInstance, ...] = ()
    devices: tuple[MigDevice, ...] = ()

    @property
    def change_pending(self) -> bool:
        return self.enabled != self.pending

    def profile(self, name_or_id: str | int) -> MigProfile | None:
        return next((p for p in self.profiles if name_or_id in (p.name, p.id)), None)


# hostagent.devices.read_inventory() -> Inventory.gpus
@dataclass(frozen=True)
class Gpu:
    index: int
    minor: int
    uuid: str
    name: str
    serial: str | None
    memory_mib: int | None     # None: NVML would not tell this process (Inventory.unread)
    pci_bus_id: str            # NVML form: "00000000:07:00.0"
    pci_device_id: int
    compute_capability: str    # "8.0"
    architecture: str          # "ampere", "hopper", ...
    mig: MigState | None       # None: the GPU is not MIG capable
    pci_subsystem_id: int = 0  # 0xSSSSVVVV, for mig-parted's qualified device filters
    numa_node: int | None = None   # from sysfs; None where the platform reports none (-1)
    pcie_root: str | None = None   # from sysfs: "pci0000:3a", as resource.kubernetes.io/pcieRoot; None: unknown
    brand: str | None = None   # nvmlDeviceGetBrand, as NVIDIA's go-nvlib spells it ("Nvidia", "Tesla")

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None and self.mig.enabled

    @property
    def sysfs_bus_id(self) -> str:
        """The bus id as /sys and /proc spell it: "0000:07:00.0"."""
        return sysfs_bus_id(self.pci_bus_id)


# hostagent.devices.migctl.MigControl.processes()
@dataclass(frozen=True)
class GpuProcess:
    """A process NVML reports on a GPU; ``gi``/``ci`` are None outside MIG instances."""
    pid: int
    gpu: int
    gi: int | None
    ci: int | None
    used_mib: int | None


# hostagent.devices.read_inventory() -> Inventory.unreadable
@dataclass(frozen=True)
class UnreadableGpu:
    """A GPU NVML counts but cannot read (lost, or failing); kept so it is never silently gone."""
    index: int
    error: str
    nvml_code: int


# hostagent.devices.read_inventory() -> Inventory.unread
@dataclass(frozen=True)
class Unread:
    """A fact of a readable GPU that NVML refused this process (NO_PERMISSION): its record
    lacks it. On a MIG-enabled GPU, without root or the mig/monitor capability."""
    gpu: int
    what: str                  # "memory", "placements", "gpu instances"
    error: str


# NVML's PCIe levels (nvmlGpuTopologyLevel_t) in nvidia-smi's notation; "BOARD" is
# NVML_TOPOLOGY_INTERNAL (two GPUs on one board), for which nvidia-smi has no code.
PCIE_LEVELS = {0: "BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
UNKNOWN = "unknown"


# hostagent.devices.read_inventory() -> Inventory.topology.gpus
@dataclass(frozen=True)
class GpuTopology:
    """Where NVML says a GPU sits: the CPUs and memory nodes near it, its NVLinks."""
    index: int
    cpu_affinity: str | None     # "0-19,40-59": the CPUs of its NUMA node (nvidia-smi's CPU Affinity)
    numa_affinity: str | None    # "0": the NUMA nodes of its memory affinity
    nvlinks: int | None          # its active NVLinks (0: none); None: unknown
    nvswitch_links: int = 0      # of which to NVSwitches
    error: str | None = None     # why NVML could not place it: its links are then unknown


# hostagent.devices.read_inventory() -> Inventory.topology.links
@dataclass(frozen=True)
class GpuLink:
    """How two GPUs (``gpus``, by index, the lower first) reach each other."""
    gpus: tuple[int, int]
    pcie: str                    # PCIE_LEVELS' codes, or "unknown"
    nvlinks: int | None          # NVLinks joining them, directly or through NVSwitches; None: unknown

    @property
    def code(self) -> str:
        """nvidia-smi topo -m's cell: ``NV<n>`` over NVLink, else the PCIe level."""
        return f"NV{self.nvlinks}" if self.nvlinks else self.pcie


# hostagent.devices.read_inventory() -> Inventory.topology
@dataclass(frozen=True)
class Topology:
    gpus: tuple[GpuTopology, ...]
    links: tuple[GpuLink, ...]   # one per pair of readable GPUs

    def gpu(self, index: int) -> GpuTopology | None:
        return next((g for g in self.gpus if g.index == index), None)

    def link(self, a: int, b: int) -> GpuLink | None:
        key = (min(a, b), max(a, b))
        return next((link for link in self.links if link.gpus == key), None)

    def peers(self, index: int) -> list[tuple[int, GpuLink]]:
        """Each other GPU and how GPU ``index`` reaches it, in index order."""
        return sorted((link.gpus[link.gpus[0] == index], link) for link in self.links if index in link.gpus)


@dataclass(frozen=True)
class Inventory:
    driver_version: str
    cuda_driver_version: str   # "12.4"
    nvml_version: str
    gpus: tuple[Gpu, ...]
    unreadable: tuple[UnreadableGpu, ...] = ()
    unread: tuple[Unread, ...] = ()
    simulated: bool = False
    device_nodes: str = "char"  # "char", or "regular-files" on a simulated node without mknod
    topology: Topology | None = None   # None: not read (an inventory built by hand)
    paths: dict = field(default_factory=dict, compare=False)

    @property
    def mig_devices(self) -> tuple[MigDevice, ...]:
        return tuple(d for g in self.gpus if g.mig for d in g.mig.devices)

    def find(self, ident: str) -> Gpu | MigDevice | None:
        """A GPU by index or UUID, or a MIG device by UUID or ``<gpu>:<mig>`` name."""
        ident = str(ident).strip()
        for gpu in self.gpus:
            if ident in (str(gpu.index), gpu.uuid):
                return gpu
        for dev in self.mig_devices:
            if ident in (dev.uuid, dev.name):
                return dev
        return None

    def to_dict(self) -> dict:
        return asdict(self)
