"""Checks of the kernel side: the module loaded and its version against the libraries and
the file on disk, nouveau, the module flavour the GPUs need, GSP firmware, Secure Boot."""

from __future__ import annotations

from ..facts import DriverFacts
from ..kmsg import find
from ..verdict import FAIL, OK, SKIPPED, WARN, Check

__all__ = ["kernel_module", "nouveau", "version_match", "module_flavour", "gsp_firmware", "secure_boot"]

RELOAD = ("reboot, or stop every GPU user (nvidia-persistenced, nvidia-fabricmanager, DCGM, GPU "
          "pods) and reload: rmmod nvidia_drm nvidia_modeset nvidia_uvm nvidia && modprobe nvidia")
BLACKLIST = ("blacklist it: printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > "
             "/etc/modprobe.d/blacklist-nouveau.conf, then update-initramfs -u (dracut -f on RHEL) "
             "and reboot")
# Architectures only one flavour of the kernel module drives (NVIDIA's open-gpu-kernel-modules
# README: Turing and later only for the open modules; Blackwell and later only by them).
NEEDS_OPEN = ("blackwell",)
NEEDS_PROPRIETARY = ("pre-turing",)
# GPUs that run GSP firmware whatever the flavour (Hopper and later boot only with it).
GSP_REQUIRED = ("hopper", "blackwell")


def _loaded_evidence(f: DriverFacts) -> list[str]:
    m = f.module
    out = []
    if m.loaded:
        out.append(f"/sys/module/{m.name}/version: {m.version or '(none)'}")
    else:
        out.append("/sys/module/nvidia: absent (the module is not loaded)")
    if m.banner:
        out.append(f"/proc/driver/nvidia/version: {m.banner.strip()}")
    return out


def _disk_evidence(f: DriverFacts) -> str:
    m = f.module
    if m.file:
        return f"{m.file}: version {m.file_version or 'unknown'}, {m.file_flavour or 'unknown'} flavour"
    if f.kernel_release:
        return f"no nvidia module on disk for kernel {f.kernel_release} (/lib/modules/{f.kernel_release})"
    return "the running kernel's release is unknown (/proc/sys/kernel/osrelease)"


def _log_lines(f: DriverFacts, *kinds: str, limit: int = 3) -> list[str]:
    lines = [m.string for kind in kinds for m in find(f.kernel_log, kind)]
    return [f"kernel log: {line}" for line in lines[-limit:]]


def kernel_module(f: DriverFacts) -> Check:
    m = f.module
    evidence = _loaded_evidence(f)
    if m.loaded:
        return Check("kernel-module", OK, f"{m.name} {m.version} loaded ({m.flavour or 'unknown'} flavour)",
                     tuple(evidence))
    evidence += [_disk_evidence(f), *_log_lines(f, "probe-not-called", "unsigned-module", "rm-init-failed")]
    if not f.pci_gpus:
        evidence.append("/sys/bus/pci/devices: no NVIDIA GPU on the PCI bus")
    if m.nouveau_loaded:
        fix = f"nouveau holds the GPUs: {BLACKLIST}"
    elif not m.file:
        fix = (f"install the driver's kernel module for kernel {f.kernel_release or '(unknown)'} "
               "('hostagent driver install --version V', or the distribution's DKMS package with "
               "the kernel headers), then modprobe nvidia")
    else:
        fix = "load it: modprobe nvidia; if that fails, the kernel log rows below say why"
    return Check("kernel-module", FAIL, "the nvidia kernel module is not loaded", tuple(evidence), fix)


def nouveau(f: DriverFacts) -> Check:
    bound = [g.bus_id for g in f.pci_gpus if g.driver == "nouveau"]
    if not f.module.nouveau_loaded and not bound:
        return Check("nouveau", OK, "nouveau is not loaded", ("/sys/module/nouveau: absent",))
    evidence = ["/sys/module/nouveau: present (nouveau is loaded)"] if f.module.nouveau_loaded else []
    evidence += [f"/sys/bus/pci/devices/{b}/driver: nouveau" for b in bound]
    evidence += _log_lines(f, "probe-not-called")
    return Check("nouveau", FAIL, "nouveau is loaded" + (f" and drives {len(bound)} GPU(s)" if bound else ""),
                 tuple(evidence), f"nouveau keeps the nvidia module from the GPUs: {BLACKLIST}")


def version_match(f: DriverFacts) -> Check:
    m = f.module
    loaded, user, disk = m.version, f.userspace_version, m.file_version
    evidence = [f"{f.userspace_library or 'libnvidia-ml.so.1'}: user-space version {user or 'unknown'}"]
    if loaded:
        evidence.append(f"/sys/module/{m.name}/version: {loaded}")
    evidence.append(_disk_evidence(f))
    if f.nvml_code == 18:
        evidence.append("nvmlInit: NVML_ERROR_LIB_RM_VERSION_MISMATCH (18), as nvidia-smi's "
                        "\"Failed to initialize NVML: Driver/library version mismatch\"")
    evidence += _log_lines(f, "api-mismatch")
    if not loaded:
        if user and disk and user != disk:
            return Check("version-match", WARN,
                         f"the libraries ({user}) and the module on disk ({disk}) differ: loading it "
                         "will fail with a version mismatch", tuple(evidence),
                         f"install the kernel module of version {user} (or libraries of {disk}) and "
                         "hold both ('hostagent driver install --version V' does)")
        return Check("version-match", SKIPPED, "no kernel module is loaded to compare with", tuple(evidence))
    if (user and user != loaded) or f.nvml_code == 18:
        summary = (f"Driver/library version mismatch: user-space libraries {user or 'unknown'}, "
                   f"kernel module {loaded}")
        if disk and disk == user:
            fix = (f"the {user} module is installed but {loaded} is still loaded (an upgrade without "
                   f"a reboot): {RELOAD}")
        elif disk and disk != user:
            fix = (f"the packages are out of step (libraries {user}, module on disk {disk}): install "
                   "one version of both ('hostagent driver install --version V') and hold them, "
                   "then reboot")
        else:
            fix = f"install the kernel module of version {user}, then {RELOAD}"
        return Check("version-match", FAIL, summary, tuple(evidence), fix)
    if disk and disk != loaded:
        return Check("version-match", WARN,
                     f"libraries and loaded module are {loaded}, but the module on disk is {disk}: "
                     "the next reboot will mismatch", tuple(evidence),
                     f"install the libraries of {disk} too, or the module of {loaded} again, and hold them")
    return Check("version-match", OK, f"kernel module and libraries are both {loaded}", tuple(evidence))


def _archs(f: DriverFacts) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for g in f.pci_gpus:
        out.setdefault(g.architecture or "unknown", []).append(g.bus_id)
    return out


def module_flavour(f: DriverFacts) -> Check:
    m = f.module
    if not m.loaded:
        return Check("module-flavour", SKIPPED, "no kernel module is loaded")
    archs = _archs(f)
    evidence = [f"/proc/driver/nvidia/version: {m.banner.strip()}" if m.banner
                else "/proc/driver/nvidia/version: absent"]
    evidence += [f"{arch}: {', '.join(buses)}" for arch, buses in sorted(archs.items())]
    evidence += _log_lines(f, "open-unsupported", "rm-init-failed")
    flavour = m.flavour
    need_open = [b for a in NEEDS_OPEN for b in archs.get(a, ())]
    need_prop = [b for a in NEEDS_PROPRIETARY for b in archs.get(a, ())]
    if flavour == "proprietary" and need_open:
        return Check("module-flavour", FAIL,
                     f"the proprietary module is loaded but {len(need_open)} GPU(s) are Blackwell or "
                     "newer, which only the open module drives", tuple(evidence),
                     "install the open flavour (Debian/CUDA repo: nvidia-open; Ubuntu: "
                     "nvidia-driver-<branch>-server-open; RHEL: the <branch>-open module stream)")
    if flavour == "open" and need_prop:
        return Check("module-flavour", FAIL,
                     f"the open module is loaded but {len(need_prop)} GPU(s) predate Turing, which "
                     "only the proprietary module drives (they have no GSP)", tuple(evidence),
                     "install the proprietary flavour (nvidia-driver / cuda-drivers / "
                     "nvidia-driver-<branch>-server, the <branch>-dkms stream)")
    if m.file_flavour and flavour and m.file_flavour != flavour:
        return Check("module-flavour", WARN,
                     f"the {flavour} module is loaded but the module on disk is {m.file_flavour}: the "
                     "next load changes flavour", tuple(evidence + [_disk_evidence(f)]),
                     "install the flavour the GPUs need and reboot, so loaded and installed agree")
    return Check("module-flavour", OK, f"the {flavour or 'unknown'} module drives every GPU's architecture",
                 tuple(evidence))


def gsp_firmware(f: DriverFacts) -> Check:
    m = f.module
    if not m.loaded:
        return Check("gsp-firmware", SKIPPED, "no kernel module is loaded")
    archs = _archs(f)
    required = m.flavour == "open" or any(a in archs for a in GSP_REQUIRED)
    where = f.firmware_dir or "/lib/firmware/nvidia/<version>"
    log = _log_lines(f, "gsp-firmware")
    evidence = [f"{where}: {', '.join(f.firmware_files) if f.firmware_files else 'no gsp_*.bin'}", *log]
    fix = (f"install the GSP firmware of exactly {m.version} (Debian: firmware-nvidia-gsp; the CUDA "
           "repository and Ubuntu ship it with the driver packages), or reinstall the driver: "
           f"{where} must hold gsp_*.bin")
    if log:
        return Check("gsp-firmware", FAIL, "the kernel log shows GSP firmware failures", tuple(evidence), fix)
    if f.firmware_files:
        return Check("gsp-firmware", OK, f"GSP firmware present for {m.version}", tuple(evidence))
    if f.firmware_next and m.file_version:
        return Check("gsp-firmware", WARN,
                     f"the firmware of the loaded {m.version} was replaced by {m.file_version}'s (an "
                     "upgrade not yet loaded): the GPUs run until the module is reloaded",
                     tuple(evidence + [f"/lib/firmware/nvidia/{m.file_version}: {', '.join(f.firmware_next)}"]),
                     f"load {m.file_version}: see the version-match row")
    if required:
        why = "the open module" if m.flavour == "open" else "Hopper and newer GPUs"
        return Check("gsp-firmware", FAIL,
                     f"no GSP firmware for {m.version}, which {why} need: the next module load will "
                     "fail (RmInitAdapter failed)", tuple(evidence), fix)
    return Check("gsp-firmware", WARN, f"no GSP firmware for {m.version}: the GPUs run without GSP",
                 tuple(evidence), fix)


def _signatures_enforced(f: DriverFacts) -> tuple[bool | None, list[str]]:
    """Whether the kernel refuses unsigned modules, and what says so; no kernel log needed."""
    if f.sig_enforce or f.lockdown in ("integrity", "confidentiality"):
        said = ["/sys/module/module/parameters/sig_enforce: Y"] if f.sig_enforce else []
        return True, said + ([f"/sys/kernel/security/lockdown: {f.lockdown}"] if f.lockdown else [])
    if f.sig_enforce is False and f.lockdown == "none":
        return False, ["/sys/module/module/parameters/sig_enforce: N", "/sys/kernel/security/lockdown: none"]
    if f.secure_boot and f.shim_validation is False:
        return False, ["MokSBStateRT: shim validation disabled (mokutil --disable-validation)"]
    return f.secure_boot, []


def secure_boot(f: DriverFacts) -> Check:
    log = _log_lines(f, "unsigned-module")
    m = f.module
    enforced, said = _signatures_enforced(f)
    if f.secure_boot is None and enforced is None and not log:
        return Check("secure-boot", SKIPPED, "Secure Boot state unknown (not an EFI system)",
                     ("/sys/firmware/efi/efivars/SecureBoot-*: absent",))
    evidence = [f"Secure Boot: {'on' if f.secure_boot else 'off' if f.secure_boot is False else 'unknown'}", *said]
    if m.file:
        evidence.append(f"{m.file}: {'signed' if m.file_signed else 'not signed'}")
    if m.loaded and m.taint:
        evidence.append(f"/sys/module/{m.name}/taint: {m.taint}" + (
            " (loaded without a valid signature)" if "E" in m.taint else ""))
    evidence += log
    fix = ("sign the module with a key enrolled in the MOK list (mokutil --import; DKMS can sign its "
           "builds), or install signed precompiled modules (Ubuntu: linux-modules-nvidia-<branch>-"
           "server-<kernel>), or turn Secure Boot off")
    if log and not m.loaded:
        return Check("secure-boot", FAIL, "the kernel refused to load an unsigned module", tuple(evidence), fix)
    if enforced and not m.loaded and m.file_signed is False:
        what = "Secure Boot is on" if f.secure_boot else "the kernel enforces module signatures"
        return Check("secure-boot", FAIL, f"{what} and the module on disk is not signed: the "
                     "kernel will refuse it", tuple(evidence), fix)
    if enforced and m.loaded:
        return Check("secure-boot", OK, "module signatures are enforced and the kernel accepted the loaded "
                     "module", tuple(evidence))
    return Check("secure-boot", OK, "Secure Boot does not stand in the module's way", tuple(evidence))
