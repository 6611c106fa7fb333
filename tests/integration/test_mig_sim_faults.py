"""The simulator's fault injection, which the MIG fault tests rely on: an NVML error or the
death of the calling process at the Nth mutating call."""

import os
import signal
import subprocess
import sys

import pynvml as N
import pytest

from hostagent.devices import nvml_session, read_inventory
from hostagent.sim.fakenvml import FAULT_ENV, Fault
from tests.rootneeds import GPU_CHANGES


def create_gi(index=0, profile=19, start=0):
    h = N.nvmlDeviceGetHandleByIndex(index)
    return N.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile, N.byref(N.c_nvmlGpuInstancePlacement_t(start, 1)))


@GPU_CHANGES
def test_error_fault_fails_only_the_chosen_mutating_call(make_node):
    host, store = make_node("hgx-h100")
    read_inventory(host)
    lib = N.nvmlLib
    with nvml_session(host):
        N.nvmlDeviceSetMigMode(N.nvmlDeviceGetHandleByIndex(0), 1)
        lib.inject("error", after=1, code=N.NVML_ERROR_INSUFFICIENT_RESOURCES)
        N.nvmlDeviceGetMigMode(N.nvmlDeviceGetHandleByIndex(0))   # reads never count
        create_gi(start=0)                                        # passes (after=1)
        with pytest.raises(N.NVMLError_InsufficientResources):
            create_gi(start=1)
        create_gi(start=1)                                        # the fault fired once
    assert [g.start for g in store.read().gpus[0].gis] == [0, 1]
    assert lib.faults == []


def test_bad_fault_specs_are_rejected():
    with pytest.raises(ValueError, match="ACTION:AFTER"):
        Fault.parse("explode:1")
    assert Fault.parse("error:2:23") == Fault("error", 2, 23)


@pytest.mark.parametrize("action, created", [("kill-before", 0), ("kill-after", 1)])
def test_kill_faults_kill_the_process_before_or_after_the_call_takes_effect(make_node, action, created):
    host, store = make_node("hgx-h100")
    with store.mutate() as s:
        s.set_mig_mode(store.facts, 0, 1)
    code = ("import sys, pynvml as N\n"
            "from hostagent.devices import nvml_session\n"
            "from hostagent.sim.platform import simulated_host\n"
            "with nvml_session(simulated_host(sys.argv[1])):\n"
            "    h = N.nvmlDeviceGetHandleByIndex(0)\n"
            "    N.nvmlDeviceCreateGpuInstanceWithPlacement(h, 19, N.byref(N.c_nvmlGpuInstancePlacement_t(0, 1)))\n"
            "print('survived')\n")
    env = {**os.environ, FAULT_ENV: f"{action}:0"}
    done = subprocess.run([sys.executable, "-c", code, str(host.root)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL and "survived" not in done.stdout
    assert len(store.read().gpus[0].gis) == created
