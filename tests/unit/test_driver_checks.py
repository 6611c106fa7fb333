"""Each driver check, on facts made by hand: a healthy node, then one thing broken at a time."""

from dataclasses import replace

import pytest

from hostagent.driver.checks import CHECK_NAMES, CHECKS, judge
from hostagent.driver.checks import gpus as g
from hostagent.driver.checks import kernel as k
from hostagent.driver.facts import DriverFacts, ModuleFacts, NodeFile, NvmlGpu, PciGpu
from hostagent.driver.kmsg import KernelLog

V = "550.90.07"
BANNER = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {V}  Tue Jun  4 08:56:33 UTC 2024"
OPEN_BANNER = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {V}  Tue Jun  4 2024"
BUSES = ("0000:07:00.0", "0000:0f:00.0")


def node(major, minor, path):
    return NodeFile(path, "char", major, minor)


def healthy(**changes) -> DriverFacts:
    nodes = {p: node(195, m, p) for p, m in (("/dev/nvidiactl", 255), ("/dev/nvidia0", 0), ("/dev/nvidia1", 1))}
    nodes.update({p: node(511, m, p) for p, m in (("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1))})
    facts = DriverFacts(
        kernel_release="6.1.0-28-amd64",
        module=ModuleFacts(loaded=True, name="nvidia", version=V, banner=BANNER, uvm_loaded=True,
                           file="/lib/modules/6.1.0-28-amd64/updates/dkms/nvidia.ko", file_version=V,
                           file_flavour="proprietary", file_signed=False),
        userspace_version=V, userspace_library=f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{V}",
        cuda_library=f"/usr/lib/x86_64-linux-gnu/libcuda.so.{V}",
        majors={"nvidia-frontend": 195, "nvidia-uvm": 511, "nvidia-caps": 510},
        gpu_minors={BUSES[0]: 0, BUSES[1]: 1},
        pci_gpus=tuple(PciGpu(b, 0x20B0, "nvidia", "ampere") for b in BUSES),
        nodes=nodes, nvml_code=0, driver_version=V, cuda_version="12.4",
        nvml_gpus=tuple(NvmlGpu(b, name="NVIDIA A100-SXM4-40GB", persistence=True) for b in BUSES),
        nvml_count=2, firmware_files=("gsp_ga10x.bin", "gsp_tu10x.bin"),
        firmware_dir=f"/lib/firmware/nvidia/{V}", persistenced=4242,
        kernel_log=KernelLog(True, (f"NVRM: loading {BANNER}",)))
    return replace(facts, **changes)


def module(**changes) -> ModuleFacts:
    return replace(healthy().module, **changes)


def log(*lines) -> KernelLog:
    return KernelLog(True, lines)


def test_a_healthy_node_passes_every_check():
    verdict = judge(healthy())
    assert [c.name for c in verdict.checks] == list(CHECK_NAMES) and len(CHECKS) == len(CHECK_NAMES)
    assert {c.name: c.result for c in verdict.checks if c.result != "ok"} == {
        "secure-boot": "skipped", "fabric": "skipped"}
    assert verdict.usable and verdict.reason == f"driver {V} verified"
    assert all(c.fix is None for c in verdict.checks)


def test_module_not_loaded_names_the_file_and_the_fix():
    unloaded = module(loaded=False, name=None, version=None, banner=None)
    c = k.kernel_module(healthy(module=unloaded))
    assert c.result == "fail" and "modprobe nvidia" in c.fix
    assert any("nvidia.ko: version 550.90.07" in e for e in c.evidence)
    c = k.kernel_module(healthy(module=replace(unloaded, file=None, file_version=None)))
    assert "no nvidia module on disk for kernel 6.1.0-28-amd64" in " ".join(c.evidence)
    assert "install the driver's kernel module" in c.fix
    assert "/sys/bus/pci/devices: no NVIDIA GPU on the PCI bus" in k.kernel_module(
        healthy(module=unloaded, pci_gpus=())).evidence
    c = k.kernel_module(healthy(module=replace(unloaded, nouveau_loaded=True)))
    assert "blacklist nouveau" in c.fix
    # Everything that needs the module is skipped, not failed twice.
    for check in (k.module_flavour, k.gsp_firmware, g.device_nodes):
        assert check(healthy(module=unloaded)).result == "skipped"


def test_nouveau_names_the_gpus_it_holds():
    facts = healthy(module=module(nouveau_loaded=True),
                    pci_gpus=(PciGpu(BUSES[0], 0x20B0, "nouveau", "ampere"),))
    c = k.nouveau(facts)
    assert c.result == "fail" and "drives 1 GPU(s)" in c.summary
    assert f"/sys/bus/pci/devices/{BUSES[0]}/driver: nouveau" in c.evidence
    assert "/etc/modprobe.d/blacklist-nouveau.conf" in c.fix


def test_mismatch_after_an_upgrade_without_reboot_says_reboot():
    new = "550.127.05"
    facts = healthy(userspace_version=new, module=module(file_version=new), nvml_code=18,
                    kernel_log=log(f"NVRM: API mismatch: the client has the version {new}, but"))
    c = k.version_match(facts)
    assert c.result == "fail"
    assert c.summary == f"Driver/library version mismatch: user-space libraries {new}, kernel module {V}"
    assert "reboot" in c.fix and f"the {new} module is installed but {V} is still loaded" in c.fix
    assert any("NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)" in e for e in c.evidence)
    assert any(e.startswith("kernel log: NVRM: API mismatch") for e in c.evidence)
    assert g.nvml(facts).fix == "see the version-match row"


def test_mismatch_with_packages_out_of_step_says_install_one_version():
    c = k.version_match(healthy(userspace_version="550.127.05", module=module(file_version="535.183.01")))
    assert c.result == "fail" and "out of step" in c.fix and "hostagent driver install" in c.fix


def test_module_on_disk_differing_warns_before_the_next_boot():
    c = k.version_match(healthy(module=module(file_version="550.127.05")))
    assert c.result == "warn" and "next reboot" in c.summary
    unloaded = module(loaded=False, version=None, file_version="535.183.01")
    c = k.version_match(healthy(module=unloaded))
    assert c.result == "warn" and "loading it will fail" in c.summary


def test_module_flavour_against_architectures():
    blackwell = tuple(PciGpu(b, 0x2901, "nvidia", "blackwell") for b in BUSES)
    c = k.module_flavour(healthy(pci_gpus=blackwell))
    assert c.result == "fail" and "only the open module drives" in c.summary and "nvidia-open" in c.fix
    open_module = module(banner=OPEN_BANNER, file_flavour="open")
    assert k.module_flavour(healthy(pci_gpus=blackwell, module=open_module)).result == "ok"
    pascal = (PciGpu(BUSES[0], 0x15F8, "nvidia", "pre-turing"),)
    c = k.module_flavour(healthy(pci_gpus=pascal, module=module(banner=OPEN_BANNER)))
    assert c.result == "fail" and "predate Turing" in c.summary
    c = k.module_flavour(healthy(module=module(file_flavour="open")))
    assert c.result == "warn" and "next load changes flavour" in c.summary


def test_gsp_firmware_required_by_open_modules_and_hopper():
    missing = dict(firmware_files=())
    assert k.gsp_firmware(healthy(**missing)).result == "warn"         # proprietary on Ampere
    c = k.gsp_firmware(healthy(module=module(banner=OPEN_BANNER), **missing))
    assert c.result == "fail" and "the open module" in c.summary and "firmware-nvidia-gsp" in c.fix
    hopper = tuple(PciGpu(b, 0x2330, "nvidia", "hopper") for b in BUSES)
    assert k.gsp_firmware(healthy(pci_gpus=hopper, **missing)).result == "fail"
    failed_load = log(f"Direct firmware load for nvidia/{V}/gsp_ga10x.bin failed with error -2")
    c = k.gsp_firmware(healthy(kernel_log=failed_load))
    assert c.result == "fail" and any("Direct firmware load" in e for e in c.evidence)
    replaced = k.gsp_firmware(healthy(module=module(file_version="550.127.05"),
                                      firmware_next=("gsp_ga10x.bin",), **missing))
    assert replaced.result == "warn" and "version-match" in replaced.fix


def test_secure_boot_refusing_an_unsigned_module():
    unloaded = module(loaded=False, version=None, banner=None)
    c = k.secure_boot(healthy(secure_boot=True, module=unloaded))
    assert c.result == "fail" and "not signed" in " ".join(c.evidence) and "mokutil --import" in c.fix
    rejected = log("Loading of unsigned module is rejected")
    c = k.secure_boot(healthy(module=unloaded, kernel_log=rejected))
    assert c.result == "fail" and "refused to load an unsigned module" in c.summary
    assert k.secure_boot(healthy(secure_boot=True)).result == "ok"            # loaded: accepted
    assert k.secure_boot(healthy(secure_boot=True, module=replace(unloaded, file_signed=True))).result == "ok"
    assert k.secure_boot(healthy(secure_boot=False)).result == "ok"


def test_secure_boot_judged_without_the_kernel_log():
    """What the daemon's sandbox leaves it: no kernel log, the kernel's policy from files."""
    unloaded = module(loaded=False, version=None, banner=None)
    no_log = KernelLog(False, error="closed")
    c = k.secure_boot(healthy(sig_enforce=True, module=unloaded, kernel_log=no_log))   # no EFI, enforced
    assert c.result == "fail" and "the kernel enforces module signatures" in c.summary
    assert "/sys/module/module/parameters/sig_enforce: Y" in c.evidence
    c = k.secure_boot(healthy(lockdown="integrity", module=unloaded, kernel_log=no_log))
    assert c.result == "fail" and "/sys/kernel/security/lockdown: integrity" in c.evidence
    # shim told not to validate (mokutil --disable-validation): Secure Boot on, unsigned loads.
    c = k.secure_boot(healthy(secure_boot=True, shim_validation=False, module=unloaded, kernel_log=no_log))
    assert c.result == "ok" and any("shim validation disabled" in e for e in c.evidence)
    c = k.secure_boot(healthy(sig_enforce=False, lockdown="none", secure_boot=True, module=unloaded))
    assert c.result == "ok"
    # Loaded without a valid signature: the taint says so.
    c = k.secure_boot(healthy(secure_boot=False, module=module(taint="POE")))
    assert c.result == "ok" and "/sys/module/nvidia/taint: POE (loaded without a valid signature)" in c.evidence


def test_device_nodes_missing_wrong_and_mig_capabilities():
    nodes = dict(healthy().nodes)
    del nodes["/dev/nvidia-uvm"]
    nodes["/dev/nvidia1"] = node(195, 7, "/dev/nvidia1")
    c = g.device_nodes(healthy(nodes=nodes))
    assert c.result == "fail"
    assert "/dev/nvidia-uvm: missing" in c.evidence and "/dev/nvidia1: 195:7, should be 195:1" in c.evidence
    assert "nvidia-modprobe -u -c 0 -c 1" in c.fix
    c = g.device_nodes(healthy(mig_enabled=(BUSES[0],)))
    assert c.result == "fail" and "/dev/nvidia-caps/nvidia-cap1: missing" in c.evidence
    regular = {p: NodeFile(p, "regular") for p in healthy().nodes}
    assert g.device_nodes(healthy(nodes=regular)).result == "fail"
    assert g.device_nodes(healthy(nodes=regular, simulated=True)).result == "ok"
    no_uvm = {k_: v for k_, v in healthy().majors.items() if k_ != "nvidia-uvm"}
    c = g.device_nodes(healthy(majors=no_uvm))
    assert c.result == "fail" and any("nvidia-uvm module is not loaded" in e for e in c.evidence)


def test_nvml_names_each_gpu_that_does_not_answer():
    lost = (NvmlGpu(BUSES[0], name="A100"), NvmlGpu(BUSES[1], code=15, error="GPU is lost"))
    c = g.nvml(healthy(nvml_gpus=lost))
    assert c.result == "fail" and c.summary == "1 of 2 GPU(s) do not answer"
    assert c.evidence == (f"GPU {BUSES[1]}: NVML_ERROR_GPU_IS_LOST (15)",)
    assert "fallen off the bus" in c.fix
    c = g.nvml(healthy(gpu_minors={BUSES[0]: 0}))
    assert c.result == "fail" and "not initialised by the nvidia module" in c.evidence[0]
    c = g.nvml(healthy(nvml_code=9, nvml_error="Driver Not Loaded"))
    assert c.result == "fail" and "kernel-module row" in c.fix
    for check in (g.persistence, g.fabric, g.cuda):
        assert check(healthy(nvml_code=9)).result == "skipped"


def test_persistence():
    assert g.persistence(healthy()).result == "ok"
    off = tuple(replace(x, persistence=False) for x in healthy().nvml_gpus)
    c = g.persistence(healthy(persistenced=None, nvml_gpus=off))
    assert c.result == "warn" and "nvidia-persistenced" in c.fix
    on = tuple(replace(x, persistence=True) for x in healthy().nvml_gpus)
    assert g.persistence(healthy(persistenced=None, nvml_gpus=on)).result == "ok"


def test_fabric_on_nvswitch_systems():
    switches = dict(nvswitches=("0000:c0:00.0", "0000:c1:00.0"))
    done = tuple(replace(x, fabric_state=3, fabric_status=0) for x in healthy().nvml_gpus)
    assert g.fabric(healthy(nvml_gpus=done, **switches)).result == "ok"
    not_started = tuple(replace(x, fabric_state=1, fabric_status=0) for x in healthy().nvml_gpus)
    c = g.fabric(healthy(nvml_gpus=not_started, **switches))
    assert c.result == "fail" and "error 802" in c.fix and "not started" in " ".join(c.evidence)
    training = tuple(replace(x, fabric_state=2, fabric_status=0) for x in healthy().nvml_gpus)
    assert g.fabric(healthy(nvml_gpus=training, **switches)).result == "warn"
    failed = tuple(replace(x, fabric_state=3, fabric_status=999) for x in healthy().nvml_gpus)
    assert g.fabric(healthy(nvml_gpus=failed, **switches)).result == "fail"
    # Before Hopper NVML does not report the fabric: the fabric manager's process decides.
    assert g.fabric(healthy(fabricmanager=77, **switches)).result == "ok"
    assert g.fabric(healthy(**switches)).result == "fail"


def test_cuda_and_kernel_log():
    assert g.cuda(healthy()).summary == "the driver offers CUDA 12.4"
    assert g.cuda(healthy(cuda_library=None)).result == "warn"
    noisy = log("NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has fallen off the bus.",
                "NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has fallen off the bus.",
                "NVRM: RmInitAdapter failed! (0x62:0x65:1860)")
    c = g.kernel_log(healthy(kernel_log=noisy))
    assert c.result == "warn" and "Xid 79 on 0000:07:00 (2 times)" in c.evidence
    assert any("RmInitAdapter failed" in e for e in c.evidence)
    c = g.kernel_log(healthy(kernel_log=KernelLog(False, error="no permission to read /dev/kmsg (run as root)")))
    assert c.result == "skipped" and "run as root" in c.summary


def test_ignored_checks_do_not_make_the_driver_unusable():
    facts = healthy(nvswitches=("0000:c0:00.0",))
    assert not judge(facts).usable
    verdict = judge(facts, ignored=("fabric",))
    assert verdict.usable and verdict.check("fabric").result == "fail"
    assert verdict.to_dict()["failed"] == [] and verdict.to_dict()["ignored"] == ["fabric"]


@pytest.mark.parametrize("device_id, arch", [(0x1EB8, "turing"), (0x20B0, "ampere"), (0x2330, "hopper"),
                                             (0x2684, "ada"), (0x2901, "blackwell"), (0x15F8, "pre-turing")])
def test_architecture_from_the_pci_device_id(device_id, arch):
    from hostagent.driver.probe import architecture_of
    assert architecture_of(device_id) == arch
