"""The driver's file readers: module info from .ko files, the kernel log from /dev/kmsg."""

import gzip
import lzma
import os

import pytest

from hostagent.driver.kmsg import find, read_kernel_log
from hostagent.driver.modinfo import read_module_info
from hostagent.hostroot import HostRoot
from hostagent.sim.kmod import module_bytes
from hostagent.sim.platform import simulated_host


@pytest.mark.parametrize("name, pack", [("nvidia.ko", bytes), ("nvidia.ko.xz", lzma.compress),
                                        ("nvidia-current.ko.gz", gzip.compress)])
def test_module_info_fields_flavour_and_signature(tmp_path, name, pack):
    path = tmp_path / name
    path.write_bytes(pack(module_bytes({"version": "570.86.15", "license": "Dual MIT/GPL"}, signed=True)))
    info = read_module_info(path)
    assert (info.version, info.flavour, info.signed) == ("570.86.15", "open", True)
    path.write_bytes(pack(module_bytes({"license": "NVIDIA", "version": "535.183.01"})))
    info = read_module_info(path)
    assert (info.version, info.flavour, info.signed) == ("535.183.01", "proprietary", False)


def test_module_info_of_what_is_not_a_module(tmp_path):
    for name, data in (("a.ko", b""), ("b.ko", b"\x7fELF\x02\x01" + b"\0" * 10), ("c.ko", b"hello"),
                       ("d.ko.zst", module_bytes({"version": "1"}))):
        (tmp_path / name).write_bytes(data)
        assert read_module_info(tmp_path / name) is None
    with pytest.raises(OSError):
        read_module_info(tmp_path / "missing.ko")


def test_kernel_log_keeps_the_driver_lines_of_every_record(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text(
        "6,1,100,-;usb 1-1: new device\n SUBSYSTEM=usb\n"
        "4,2,200,-;NVRM: API mismatch: the client has the version 550.127.05, but\n"
        "4,3,201,-;NVRM: this kernel module has the version 550.90.07.  Please\n"
        "3,4,300,-;NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has fallen off the bus.\n"
        "3,5,400,-;Loading of unsigned module is rejected")
    log = read_kernel_log(simulated_host(tmp_path))
    assert log.readable and len(log.lines) == 4 and not any("usb" in line for line in log.lines)
    assert [m.group(1) for m in find(log, "api-mismatch")] == ["550.127.05"]
    assert [(m.group(1), m.group(2)) for m in find(log, "xid")] == [("0000:07:00", "79")]
    assert len(find(log, "unsigned-module")) == 1


def test_the_kernels_signature_policy_is_read_from_files(tmp_path):
    from hostagent.driver.probe import EFI_MOK_SB_STATE, EFI_SECURE_BOOT, _module, _signature_policy
    host = HostRoot(tmp_path)
    assert _signature_policy(host) == {}                       # not EFI, no module signing
    efi = tmp_path / EFI_SECURE_BOOT.lstrip("/")
    efi.parent.mkdir(parents=True)
    efi.write_bytes(b"\x06\0\0\0\x01")                        # attributes, then on
    (tmp_path / "sys/module/module/parameters").mkdir(parents=True)
    (tmp_path / "sys/module/module/parameters/sig_enforce").write_text("N\n")
    (tmp_path / "sys/kernel/security").mkdir(parents=True)
    (tmp_path / "sys/kernel/security/lockdown").write_text("none [integrity] confidentiality\n")
    assert _signature_policy(host) == {"shim_validation": True, "sig_enforce": False, "lockdown": "integrity"}
    (tmp_path / EFI_MOK_SB_STATE.lstrip("/")).write_bytes(b"\x06\0\0\0\x01")    # mokutil --disable-validation
    assert _signature_policy(host)["shim_validation"] is False
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/refcnt").write_text("0\n")
    (tmp_path / "sys/module/nvidia/taint").write_text("POE\n")
    assert _module(host, None).taint == "POE"


def test_kernel_log_missing_is_said_not_raised(tmp_path):
    log = read_kernel_log(simulated_host(tmp_path))
    assert not log.readable and "does not exist" in log.error


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/kmsg"), reason="reading /dev/kmsg needs root")
def test_the_real_kernel_log_reads_to_its_end_without_blocking():
    log = read_kernel_log(HostRoot())
    assert log.readable, log.error
