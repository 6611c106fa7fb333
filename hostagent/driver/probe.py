"""Read the driver's state from the host into ``DriverFacts``: sysfs, /proc, /dev, the
driver's files, the kernel log, and NVML (initialised once, asked per PCI bus id so a GPU
that does not answer is named by its address).

Nothing here judges; nothing fails: what cannot be read is recorded as unknown.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..fileio import pid_alive
from ..hostroot import LIBRARY_DIRS, HostRoot
from .facts import DriverFacts, ModuleFacts, NodeFile, NvmlGpu, PciGpu
from .kmsg import read_kernel_log

__all__ = ["probe", "PERSISTENCED_PID", "FABRICMANAGER_PID", "EFI_SECURE_BOOT", "architecture_of"]

PERSISTENCED_PID = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
FABRICMANAGER_PID = "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
EFI_SECURE_BOOT = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# shim's own variable: 1 after 'mokutil --disable-validation' (what 'mokutil --sb-state' reads).
EFI_MOK_SB_STATE = "/sys/firmware/efi/efivars/MokSBStateRT-605dab50-e046-4300-abb6-3dd810dd8b23"
MODULE_NAMES = ("nvidia", "nvidia_current")            # Debian names its module nvidia-current
_NVIDIA_VENDOR = "0x10de"
_GPU_CLASSES = ("0x0300", "0x0302")                    # VGA and 3D controllers

# PCI device id ranges -> architecture, for GPUs NVML cannot name (it fails on exactly the
# GPUs whose module flavour is wrong). Coarse blocks of NVIDIA's device id space; NVML's
# own answer wins whenever it has one.
_ID_RANGES = ((0x1E00, 0x2000, "turing"), (0x2080, 0x2100, "ampere"), (0x2180, 0x2200, "turing"),
              (0x2200, 0x2300, "ampere"), (0x2300, 0x2400, "hopper"), (0x2400, 0x2600, "ampere"),
              (0x2600, 0x2900, "ada"), (0x2900, 0x10000, "blackwell"))


def architecture_of(device_id: int) -> str:
    for low, high, arch in _ID_RANGES:
        if low <= device_id < high:
            return arch
    return "pre-turing"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _alive(host: HostRoot, pid_file: str) -> int | None:
    """The pid in the host's ``pid_file`` if that process lives. A mounted host's pids are
    those of its /proc (this process may be in a PID namespace of its own, a container's);
    a simulated node's daemons are this machine's processes. The file is its daemon's (a
    daemon that may run as a user of its own): read without blocking, a regular file of a
    few bytes, no symlink."""
    from ..fileio import read_regular
    try:
        pid = int(read_regular(str(host.host(pid_file)), 64, follow=False)[0].decode().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    if host.mounted and not host.simulated:
        stat_line = _read(host.proc(f"{pid}/stat"))
        return pid if stat_line and stat_line.rpartition(")")[2].split()[:1] != ["Z"] else None
    return pid if pid_alive(pid) else None


def _module(host: HostRoot, release: str | None) -> ModuleFacts:
    name = next((n for n in MODULE_NAMES if host.sys(f"module/{n}").is_dir()), None)
    version = _read(host.sys(f"module/{name}/version")) if name else None
    banner = (_read(host.proc("driver/nvidia/version")) or "").partition("\n")[0] or None
    file = _module_file(host, release)
    info = None
    if file is not None:
        from .modinfo import read_module_info
        try:
            info = read_module_info(file)
        except OSError:
            info = None
    return ModuleFacts(
        loaded=name is not None and (host.sys(f"module/{name}/refcnt").exists() or version is not None),
        name=name, version=version.strip() if version else None, banner=banner,
        uvm_loaded=host.sys("module/nvidia_uvm").is_dir(),
        nouveau_loaded=host.sys("module/nouveau").is_dir(),
        file=host.shown(file) if file else None, file_version=info.version if info else None,
        file_flavour=info.flavour if info else None, file_signed=info.signed if info else None,
        taint=(_read(host.sys(f"module/{name}/taint")) or "").strip() or None if name else None)


def _module_file(host: HostRoot, release: str | None) -> Path | None:
    """The nvidia module modprobe would load for the running kernel (modules.dep names it)."""
    if not release:
        return None
    base = host.host(f"/lib/modules/{release}")
    wanted = {f"{n}.ko{ext}" for n in ("nvidia", "nvidia-current") for ext in ("", ".xz", ".gz", ".zst")}
    for line in (_read(base / "modules.dep") or "").splitlines():
        rel = line.partition(":")[0]
        if rel.rpartition("/")[2] in wanted and (base / rel).exists():
            return base / rel
    for sub in ("updates", "extra", "kernel/drivers/video"):
        for found in sorted((base / sub).rglob("nvidia*.ko*")):
            if found.name in wanted:
                return found
    return None


def _userspace(host: HostRoot, library: str) -> tuple[str | None, str | None]:
    """(version, path) of the library ``library`` (an .so.1 name) resolves to."""
    for rel in LIBRARY_DIRS:
        link = host.driver(rel) / library
        if not os.path.lexists(link):
            continue
        target = host.resolve(link).name if link.is_symlink() else link.name
        stem = library.rsplit(".so.", 1)[0] + ".so."
        version = target[len(stem):] if target.startswith(stem) and target != library else None
        return version, host.shown(link.parent / target)
    return None, None


_VFIO_DRIVERS = ("vfio-pci", "nvgrace_gpu_vfio_pci")


def _pci_gpus(host: HostRoot) -> list[tuple[str, int, str | None]]:
    out = []
    devices = host.sys("bus/pci/devices")
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        return out
    for bdf in entries:
        d = devices / bdf
        if (_read(d / "vendor") or "").strip() != _NVIDIA_VENDOR:
            continue
        if not (_read(d / "class") or "").strip().startswith(_GPU_CLASSES):
            continue
        try:
            device_id = int((_read(d / "device") or "0").strip(), 16)
        except ValueError:
            device_id = 0
        driver = os.path.basename(os.readlink(d / "driver")) if (d / "driver").is_symlink() else None
        if driver in _VFIO_DRIVERS:
            continue            # passed through to a VM: given away from the nvidia driver on purpose
        out.append((bdf, device_id, driver))
    return out


def _gpu_minors(host: HostRoot) -> dict[str, int]:
    out = {}
    gpus = host.proc("driver/nvidia/gpus")
    try:
        entries = os.listdir(gpus)
    except OSError:
        return out
    for bdf in entries:
        for line in (_read(gpus / bdf / "information") or "").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and value.strip().isdigit():
                out[bdf.lower()] = int(value.strip())
    return out


def _nodes(host: HostRoot) -> dict[str, NodeFile]:
    out = {}
    for rel in ("", "nvidia-caps"):
        directory = host.dev(rel)
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if not name.startswith("nvidia") or (not rel and name == "nvidia-caps"):
                continue
            path = f"/dev/{rel + '/' if rel else ''}{name}"
            try:
                st = os.lstat(directory / name)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                out[path] = NodeFile(path, "char", os.major(st.st_rdev), os.minor(st.st_rdev))
            else:
                out[path] = NodeFile(path, "regular" if stat.S_ISREG(st.st_mode) else "other")
    return out


def _efi_flag(host: HostRoot, path: str) -> bool | None:
    try:
        data = host.host(path).read_bytes()
    except OSError:
        return None
    return bool(data[4]) if len(data) >= 5 else None     # 4 bytes of attributes, then the value


def _secure_boot(host: HostRoot) -> bool | None:
    return _efi_flag(host, EFI_SECURE_BOOT)


def _signature_policy(host: HostRoot) -> dict:
    """How the kernel treats unsigned modules, from files the kernel log is not needed for
    (the daemon's sandbox hides the log): shim's validation state, module.sig_enforce, and
    the lockdown mode (integrity and above refuse unsigned modules)."""
    out = {}
    if _secure_boot(host) is not None:
        disabled = _efi_flag(host, EFI_MOK_SB_STATE)
        out["shim_validation"] = not disabled
    enforce = (_read(host.sys("module/module/parameters/sig_enforce")) or "").strip()
    if enforce in ("Y", "N"):
        out["sig_enforce"] = enforce == "Y"
    lockdown = _read(host.sys("kernel/security/lockdown")) or ""
    if "[" in lockdown:
        out["lockdown"] = lockdown.partition("[")[2].partition("]")[0]
    return out


def _nvml(host: HostRoot, pci: list, nvswitch: bool) -> dict:
    """NVML's answers: init code, versions, and per GPU its handle lookup, persistence mode
    and fabric state. The library is shut down again before returning."""
    import pynvml as N
    from ..devices.reader import ARCHITECTURES, load_nvml
    out: dict = {}
    try:
        load_nvml(host)
        N.nvmlInit()
    except N.NVMLError as e:
        return {"nvml_code": e.value, "nvml_error": str(e)}
    except Exception as e:            # the simulated node's files unreadable, and the like
        return {"nvml_code": N.NVML_ERROR_UNKNOWN, "nvml_error": str(e)}
    try:
        out["nvml_code"] = 0
        out["driver_version"] = _text(N.nvmlSystemGetDriverVersion())
        cuda = N.nvmlSystemGetCudaDriverVersion()
        out["cuda_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        out["nvml_count"] = N.nvmlDeviceGetCount()
        gpus, archs, mig = [], {}, []
        for bdf, _, _ in pci:
            gpus.append(_nvml_gpu(N, bdf, nvswitch, archs, mig, ARCHITECTURES))
        out.update(nvml_gpus=tuple(gpus), archs=archs, mig_enabled=tuple(mig))
    except N.NVMLError as e:
        out.update(nvml_code=e.value, nvml_error=str(e))
    finally:
        try:
            N.nvmlShutdown()
        except N.NVMLError:
            pass
    return out


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_gpu(N, bdf: str, nvswitch: bool, archs: dict, mig: list, arch_names: dict) -> NvmlGpu:
    try:
        h = N.nvmlDeviceGetHandleByPciBusId(bdf)
        name = _text(N.nvmlDeviceGetName(h))
        archs[bdf] = arch_names.get(N.nvmlDeviceGetArchitecture(h))
    except N.NVMLError as e:
        return NvmlGpu(bdf, code=e.value, error=str(e))
    try:
        persistence = N.nvmlDeviceGetPersistenceMode(h) == N.NVML_FEATURE_ENABLED
    except N.NVMLError:
        persistence = None
    try:
        if N.nvmlDeviceGetMigMode(h)[0] == N.NVML_DEVICE_MIG_ENABLE:
            mig.append(bdf)
    except N.NVMLError:
        pass
    state = status = None
    if nvswitch:
        info = N.c_nvmlGpuFabricInfo_t()
        try:
            N.nvmlDeviceGetGpuFabricInfo(h, N.byref(info))
            state, status = info.state, info.status
        except N.NVMLError:
            pass                       # before Hopper: NOT_SUPPORTED; the daemon's pid decides
    return NvmlGpu(bdf, name=name, persistence=persistence, fabric_state=state, fabric_status=status)


def _firmware(directory: Path | None) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in directory.glob("gsp_*.bin"))) if directory else ()


def probe(host: HostRoot, *, nvml: bool = True) -> DriverFacts:
    release = (_read(host.proc("sys/kernel/osrelease")) or "").strip() or None
    module = _module(host, release)
    pci = _pci_gpus(host)
    nvswitches = tuple(sorted(os.listdir(host.proc("driver/nvidia-nvswitch/devices"))
                              if host.proc("driver/nvidia-nvswitch/devices").is_dir() else ()))
    userspace, library = _userspace(host, "libnvidia-ml.so.1")
    _, cuda_library = _userspace(host, "libcuda.so.1")
    answers = _nvml(host, pci, bool(nvswitches)) if nvml else {}
    archs = answers.pop("archs", {})
    pci_gpus = tuple(PciGpu(bdf, device_id, driver, archs.get(bdf) or architecture_of(device_id))
                     for bdf, device_id, driver in pci)
    version = module.version or answers.get("driver_version")
    firmware_dir = host.driver(f"lib/firmware/nvidia/{version}") if version else None
    firmware = _firmware(firmware_dir)
    next_version = module.file_version if module.file_version != version else None
    firmware_next = _firmware(host.driver(f"lib/firmware/nvidia/{next_version}")) if next_version else ()
    from .nvcaps import read_char_majors
    try:
        majors = read_char_majors(host)
    except OSError:
        majors = {}
    return DriverFacts(
        simulated=host.simulated, kernel_release=release, module=module,
        userspace_version=userspace, userspace_library=library, cuda_library=cuda_library,
        majors=majors, gpu_minors=_gpu_minors(host), pci_gpus=pci_gpus, nodes=_nodes(host),
        firmware_files=firmware, firmware_dir=host.shown(firmware_dir) if firmware_dir else None,
        firmware_next=firmware_next,
        persistenced=_alive(host, PERSISTENCED_PID), nvswitches=nvswitches,
        fabricmanager=_alive(host, FABRICMANAGER_PID), secure_boot=_secure_boot(host),
        kernel_log=read_kernel_log(host), **_signature_policy(host), **answers)
