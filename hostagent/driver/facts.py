"""What ``driver verify`` read from the host: plain, immutable records the checks judge.

Reading (``probe.py``) and judging (``checks.py``) are apart so that every check is a pure
function over these records, testable with facts made by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .kmsg import KernelLog

__all__ = ["NodeFile", "PciGpu", "NvmlGpu", "ModuleFacts", "DriverFacts"]


@dataclass(frozen=True)
class NodeFile:
    """A file under /dev as found: ``kind`` is char, regular, missing or other."""
    path: str                 # as on the host: "/dev/nvidia0"
    kind: str
    major: int | None = None
    minor: int | None = None


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA display or 3D controller on the PCI bus (sysfs)."""
    bus_id: str               # sysfs form: "0000:07:00.0"
    device_id: int            # 0x20b0
    driver: str | None        # the kernel driver bound to it: nvidia, nouveau, vfio-pci; None: none
    architecture: str | None = None   # from NVML when it answers, else from the device id


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML answers for its bus id."""
    bus_id: str               # sysfs form
    code: int = 0             # NVML return code of the handle lookup (0: answered)
    error: str | None = None
    name: str | None = None
    persistence: bool | None = None
    fabric_state: int | None = None      # NVML_GPU_FABRIC_STATE_*; None: not supported
    fabric_status: int | None = None     # an NVML return code, once the state is COMPLETED


@dataclass(frozen=True)
class ModuleFacts:
    """The nvidia kernel module: loaded (sysfs, /proc) and on disk (the file modprobe loads)."""
    loaded: bool = False
    name: str | None = None              # sysfs name: nvidia, or nvidia_current (Debian)
    version: str | None = None           # /sys/module/<name>/version
    banner: str | None = None            # first line of /proc/driver/nvidia/version
    uvm_loaded: bool = False
    nouveau_loaded: bool = False
    file: str | None = None              # on disk, for the running kernel
    file_version: str | None = None
    file_flavour: str | None = None
    file_signed: bool | None = None
    taint: str | None = None             # /sys/module/<name>/taint: "E" loaded without a valid signature

    @property
    def flavour(self) -> str | None:
        """open or proprietary, from the banner the loaded module prints."""
        if not self.banner:
            return None
        return "open" if "Open Kernel Module" in self.banner else "proprietary"


@dataclass(frozen=True)
class DriverFacts:
    simulated: bool = False
    kernel_release: str | None = None
    module: ModuleFacts = field(default_factory=ModuleFacts)
    userspace_version: str | None = None     # from libnvidia-ml.so.1's target
    userspace_library: str | None = None
    cuda_library: str | None = None          # libcuda.so.1's target
    majors: dict = field(default_factory=dict)           # /proc/devices, character devices
    gpu_minors: dict = field(default_factory=dict)       # bus id -> minor (/proc/driver/nvidia/gpus)
    pci_gpus: tuple[PciGpu, ...] = ()
    nodes: dict = field(default_factory=dict)            # "/dev/nvidia0" -> NodeFile
    mig_enabled: tuple[str, ...] = ()                    # bus ids of GPUs with MIG mode on
    nvml_code: int | None = None             # nvmlInit's return code; None: not tried
    nvml_error: str | None = None
    driver_version: str | None = None        # as NVML reports it
    cuda_version: str | None = None          # "12.4"
    nvml_gpus: tuple[NvmlGpu, ...] = ()
    nvml_count: int | None = None
    firmware_files: tuple[str, ...] = ()     # gsp_*.bin for the loaded version
    firmware_dir: str | None = None
    firmware_next: tuple[str, ...] = ()      # gsp_*.bin for the module on disk, when another version
    persistenced: int | None = None          # pid of a live nvidia-persistenced
    nvswitches: tuple[str, ...] = ()         # /proc/driver/nvidia-nvswitch/devices entries
    fabricmanager: int | None = None         # pid of a live nv-fabricmanager
    secure_boot: bool | None = None          # None: not an EFI system, or unknown
    shim_validation: bool | None = None      # False: MokSBStateRT says shim does not validate
    sig_enforce: bool | None = None          # /sys/module/module/parameters/sig_enforce
    lockdown: str | None = None              # /sys/kernel/security/lockdown's mode: none, integrity...
    kernel_log: KernelLog = field(default_factory=lambda: KernelLog(False))

    @property
    def nvml_ok(self) -> bool:
        return self.nvml_code == 0
