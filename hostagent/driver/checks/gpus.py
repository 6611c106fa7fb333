"""Checks of what user space meets: device nodes, NVML and every GPU, persistence, the
NVSwitch fabric, CUDA, and the driver's errors in the kernel log."""

from __future__ import annotations

from collections import Counter

from ..facts import DriverFacts, NodeFile
from ..kmsg import find
from ..verdict import FAIL, OK, SKIPPED, WARN, Check

__all__ = ["device_nodes", "expected_nodes", "nvml", "persistence", "fabric", "cuda", "kernel_log",
           "NVML_CODES"]

NVIDIA_MAJOR = 195
NVML_CODES = {4: "NVML_ERROR_NO_PERMISSION", 9: "NVML_ERROR_DRIVER_NOT_LOADED",
              12: "NVML_ERROR_LIBRARY_NOT_FOUND", 15: "NVML_ERROR_GPU_IS_LOST",
              16: "NVML_ERROR_RESET_REQUIRED", 17: "NVML_ERROR_OPERATING_SYSTEM",
              18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 27: "NVML_ERROR_NOT_READY",
              28: "NVML_ERROR_GPU_NOT_FOUND", 999: "NVML_ERROR_UNKNOWN"}
_NVML_FIX = {
    9: "the kernel module is not loaded: see the kernel-module row",
    12: "install the driver's user-space libraries (libnvidia-ml.so.1)",
    18: "see the version-match row",
    4: "run as root, or as a member of the group that owns /dev/nvidiactl",
    17: "the device nodes are blocked (cgroup device rules, a container without them): allow "
        "the nvidia character devices",
}
_NVML_TEXT = {12: "the NVML library libnvidia-ml.so.1 could not be loaded",
              9: "the NVIDIA kernel driver is not loaded", 18: "Driver/library version mismatch"}
_GPU_FIX = {
    15: "the GPU has fallen off the bus (Xid 79): drain the node, then reset the GPU "
        "(nvidia-smi -r -i <bus id>) or reboot; if it recurs, check power and the PCIe slot",
    16: "reset the GPU (nvidia-smi -r -i <bus id>) or reboot",
    27: "the GPU is still initialising: verify again in a minute",
}
FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
FABRIC_COMPLETED = 3


def _code(code: int | None) -> str:
    return f"{NVML_CODES.get(code, 'NVML error')} ({code})"


def expected_nodes(f: DriverFacts) -> list[tuple[str, int | None, int]]:
    """(path, major, minor) of every node the loaded driver's users need."""
    gpu_major = f.majors.get("nvidia-frontend", f.majors.get("nvidia", NVIDIA_MAJOR))
    uvm = f.majors.get("nvidia-uvm")
    want = [("/dev/nvidiactl", gpu_major, 255)]
    want += [(f"/dev/nvidia{minor}", gpu_major, minor) for minor in sorted(f.gpu_minors.values())]
    want += [("/dev/nvidia-uvm", uvm, 0), ("/dev/nvidia-uvm-tools", uvm, 1)]
    if f.mig_enabled:
        caps = f.majors.get("nvidia-caps")
        want += [("/dev/nvidia-caps/nvidia-cap1", caps, 1), ("/dev/nvidia-caps/nvidia-cap2", caps, 2)]
    return want


def _node_problem(node: NodeFile | None, major: int | None, minor: int, simulated: bool) -> str | None:
    if node is None:
        return "missing"
    if node.kind == "regular" and simulated:
        return None            # a simulated node built without the right to make device nodes
    if node.kind != "char":
        return f"a {node.kind} file, not a character device"
    if major is not None and (node.major, node.minor) != (major, minor):
        return f"{node.major}:{node.minor}, should be {major}:{minor}"
    return None


def device_nodes(f: DriverFacts) -> Check:
    if not f.module.loaded:
        return Check("device-nodes", SKIPPED, "no kernel module is loaded")
    problems, found = [], []
    for path, major, minor in expected_nodes(f):
        why = _node_problem(f.nodes.get(path), major, minor, f.simulated)
        (problems if why else found).append(f"{path}: {why}" if why else path)
    evidence = list(problems)
    if "nvidia-uvm" not in f.majors:
        evidence.append("/proc/devices: no nvidia-uvm (the nvidia-uvm module is not loaded)")
    if not problems and "nvidia-uvm" in f.majors:
        return Check("device-nodes", OK, f"{len(found)} device nodes present with the right numbers",
                     (f"present: {', '.join(found)}",))
    minors = " ".join(f"-c {m}" for m in sorted(f.gpu_minors.values()))
    return Check("device-nodes", FAIL, f"{len(problems) or 'the uvm'} device node(s) missing or wrong",
                 tuple(evidence),
                 f"create them: nvidia-modprobe -u {minors} (loads nvidia-uvm and makes its nodes), "
                 "or 'hostagent driver create-nodes'; containers need /dev/nvidia-uvm for CUDA")


def nvml(f: DriverFacts) -> Check:
    if f.nvml_code is None:
        return Check("nvml", SKIPPED, "NVML was not asked")
    if not f.nvml_ok:
        why = _NVML_TEXT.get(f.nvml_code) or f.nvml_error or _code(f.nvml_code)
        return Check("nvml", FAIL, f"NVML does not initialise: {why}",
                     (f"nvmlInit: {_code(f.nvml_code)}",),
                     _NVML_FIX.get(f.nvml_code, "see the rows above and the kernel log"))
    failing = [g for g in f.nvml_gpus if g.code]
    unclaimed = [g.bus_id for g in f.pci_gpus if g.bus_id not in f.gpu_minors]
    evidence = [f"GPU {g.bus_id}: {_code(g.code)}" for g in failing]
    evidence += [f"GPU {b}: on the PCI bus but not in /proc/driver/nvidia/gpus (not initialised "
                 "by the nvidia module)" for b in unclaimed]
    if failing or unclaimed:
        fixes = sorted({_GPU_FIX.get(g.code, "check the kernel log for this bus id (Xid, RmInitAdapter)")
                        for g in failing})
        if unclaimed:
            fixes.append("a GPU the module did not take: see the nouveau, module-flavour and kernel-log rows")
        return Check("nvml", FAIL, f"{len(failing) + len(unclaimed)} of {len(f.pci_gpus)} GPU(s) do not answer",
                     tuple(evidence), "; ".join(fixes))
    names = Counter(g.name for g in f.nvml_gpus)
    return Check("nvml", OK, f"NVML answers for every GPU ({len(f.nvml_gpus)})",
                 (f"nvmlInit: ok; driver {f.driver_version}",
                  *(f"{n}x {name}" for name, n in sorted(names.items()))))


def persistence(f: DriverFacts) -> Check:
    if not f.nvml_ok:
        return Check("persistence", SKIPPED, "NVML does not answer")
    on = [g for g in f.nvml_gpus if g.persistence]
    if f.persistenced:
        return Check("persistence", OK, f"nvidia-persistenced runs (pid {f.persistenced})",
                     (f"/var/run/nvidia-persistenced/nvidia-persistenced.pid: {f.persistenced}",))
    if f.nvml_gpus and len(on) == len(f.nvml_gpus):
        return Check("persistence", OK, "persistence mode is on for every GPU",
                     ("nvmlDeviceGetPersistenceMode: enabled on every GPU",))
    return Check("persistence", WARN, "no persistence: the driver tears GPU state down whenever the last "
                 "client exits, which slows every CUDA start",
                 ("/var/run/nvidia-persistenced/nvidia-persistenced.pid: no live process",
                  f"persistence mode on {len(on)} of {len(f.nvml_gpus)} GPU(s)"),
                 "systemctl enable --now nvidia-persistenced (or run nvidia-persistenced "
                 "--persistence-mode)")


def fabric(f: DriverFacts) -> Check:
    if not f.nvswitches:
        return Check("fabric", SKIPPED, "no NVSwitch: no fabric manager needed",
                     ("/proc/driver/nvidia-nvswitch/devices: absent or empty",))
    evidence = [f"/proc/driver/nvidia-nvswitch/devices: {len(f.nvswitches)} NVSwitch(es)",
                f"nv-fabricmanager: {f'pid {f.fabricmanager}' if f.fabricmanager else 'no live process'}"
                " (/var/run/nvidia-fabricmanager/nv-fabricmanager.pid)"]
    fix = (f"install nvidia-fabricmanager of exactly {f.driver_version or 'the driver version'} and "
           "start it (systemctl enable --now nvidia-fabricmanager); until then CUDA fails with "
           "error 802 (system not yet initialized)")
    if not f.nvml_ok:
        return Check("fabric", SKIPPED, "NVML does not answer", tuple(evidence))
    known = [g for g in f.nvml_gpus if g.fabric_state not in (None, 0)]
    if not known:             # before Hopper NVML does not report the fabric: the daemon decides
        if f.fabricmanager:
            return Check("fabric", OK, "the fabric manager runs", tuple(evidence))
        return Check("fabric", FAIL, "NVSwitch system without a running fabric manager", tuple(evidence), fix)
    bad = [g for g in known if g.fabric_state != FABRIC_COMPLETED or g.fabric_status]
    evidence += [f"GPU {g.bus_id}: fabric {FABRIC_STATES.get(g.fabric_state, g.fabric_state)}"
                 + (f", status {_code(g.fabric_status)}" if g.fabric_status else "") for g in bad]
    if bad:
        waiting = all(g.fabric_state == 2 and not g.fabric_status for g in bad)
        return Check("fabric", WARN if waiting else FAIL,
                     f"fabric registration not complete on {len(bad)} GPU(s)", tuple(evidence),
                     "wait for the fabric manager to finish, then verify again" if waiting else fix)
    return Check("fabric", OK, f"fabric registration complete on {len(known)} GPU(s)", tuple(evidence))


def cuda(f: DriverFacts) -> Check:
    if not f.nvml_ok:
        return Check("cuda", SKIPPED, "NVML does not answer")
    evidence = [f"nvmlSystemGetCudaDriverVersion: {f.cuda_version}",
                f"libcuda.so.1: {f.cuda_library or 'absent'}"]
    if not f.cuda_library:
        return Check("cuda", WARN, f"the driver offers CUDA {f.cuda_version} but libcuda.so.1 is missing",
                     tuple(evidence), "install the driver's CUDA library (Debian: libcuda1; RHEL: "
                     "nvidia-driver-cuda-libs)")
    return Check("cuda", OK, f"the driver offers CUDA {f.cuda_version}", tuple(evidence))


def kernel_log(f: DriverFacts) -> Check:
    log = f.kernel_log
    if not log.readable:
        return Check("kernel-log", SKIPPED, f"the kernel log cannot be read: {log.error}")
    xids = Counter((m.group(1).lower(), int(m.group(2))) for m in find(log, "xid"))
    errors = [m.string for kind in ("rm-init-failed", "gsp-firmware", "api-mismatch", "unsigned-module",
                                    "open-unsupported", "probe-not-called") for m in find(log, kind)]
    evidence = [f"Xid {xid} on {bus}" + (f" ({n} times)" if n > 1 else "") for (bus, xid), n in sorted(xids.items())]
    evidence += errors[-5:]
    if not evidence:
        return Check("kernel-log", OK, "no driver errors in the kernel log",
                     (f"/dev/kmsg: {len(log.lines)} driver line(s), none an error",))
    return Check("kernel-log", WARN,
                 f"{sum(xids.values())} Xid(s) and {len(errors)} driver error line(s) in the kernel log",
                 tuple(evidence), "the rows above name what these errors mean for the driver; Xids "
                 "are explained in NVIDIA's Xid catalogue and tracked by 'hostagent health'")
