"""The simulated driver's compute mode and time-slice, as NVML, nvidia-smi and the MPS
stand-ins see them."""

import os
import subprocess

import pynvml as N
import pytest

from hostagent.devices import nvml_session, read_inventory
from hostagent.sim.control import reboot, set_driver_loaded
from tests.rootneeds import GPU_CHANGES


def smi(host, *args):
    done = subprocess.run([str(host.driver("usr/bin/nvidia-smi")), *args], capture_output=True, text=True)
    return done.returncode, done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="setting compute modes needs root (nvml.h); CI runs as root")
def test_compute_mode_through_nvml_and_nvidia_smi_agree(make_node):
    host, store = make_node("a30x4")
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(1)
        assert N.nvmlDeviceGetComputeMode(h) == N.NVML_COMPUTEMODE_DEFAULT
        N.nvmlDeviceSetComputeMode(h, N.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        with pytest.raises(N.NVMLError) as e:        # "Support Removed"
            N.nvmlDeviceSetComputeMode(h, N.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
        assert e.value.value == N.NVML_ERROR_INVALID_ARGUMENT
    code, out = smi(host, "--query-gpu=index,compute_mode", "--format=csv,noheader")
    assert out.splitlines()[:2] == ["0, Default", "1, Exclusive_Process"]
    assert "E. Process" in smi(host, "-i", "1")[1]
    assert smi(host, "-i", "0", "-c", "2")[0] == 0 and smi(host, "-i", "0", "-c", "1")[0] == 2
    with nvml_session(host):
        assert N.nvmlDeviceGetComputeMode(N.nvmlDeviceGetHandleByIndex(0)) == N.NVML_COMPUTEMODE_PROHIBITED
    assert smi(host, "compute-policy", "-i", "1", "--set-timeslice", "3")[0] == 0
    assert smi(host, "compute-policy", "-i", "1", "--set-timeslice", "4")[0] == 2
    assert smi(host, "compute-policy", "-l", "-i", "1")[1].strip().endswith("Timeslice: Long")
    # Neither survives a driver reload or a reboot (nvml.h: "not persistent across reboots").
    set_driver_loaded(store, False)
    set_driver_loaded(store, True)
    assert "0, Default" in smi(host, "--query-gpu=index,compute_mode", "--format=csv,noheader")[1]
    smi(host, "-i", "2", "-c", "EXCLUSIVE_PROCESS")
    reboot(store)
    assert set(smi(host, "--query-gpu=compute_mode", "--format=csv,noheader")[1].split()) == {"Default"}
    assert "Timeslice: Default" in smi(host, "compute-policy", "-l", "-i", "1")[1]


@GPU_CHANGES
def test_mig_device_handles_have_no_compute_mode_of_their_own(make_node):
    host, store = make_node("hgx-h100")           # Hopper: MIG mode applies at once
    assert smi(host, "-i", "0", "-mig", "1")[0] == 0
    assert smi(host, "mig", "-i", "0", "-cgi", "1g.10gb", "-C")[0] == 0
    (dev,) = read_inventory(host).mig_devices
    with nvml_session(host):
        mig = N.nvmlDeviceGetHandleByUUID(dev.uuid.encode())
        with pytest.raises(N.NVMLError) as e:
            N.nvmlDeviceGetComputeMode(mig)
        assert e.value.value == N.NVML_ERROR_NOT_SUPPORTED
