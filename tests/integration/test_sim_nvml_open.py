"""The simulated driver counts what NVML holds open: a GPU a process attached (took a
handle to) keeps its unbind lock refused until that process's last nvmlShutdown, or until
the process ends; a GPU it never attached, or an NVML merely initialised, holds nothing
(nvml.h on nvmlInit_v2, nvmlDeviceGetHandleBy*, nvmlShutdown; nv-procfs.c's unbindLock)."""

import subprocess
import sys

import pynvml as N
import pytest

from hostagent.devices.reader import load_nvml
from hostagent.sim import pcibus

GPU0, GPU1 = "0000:17:00.0", "0000:65:00.0"


def lock(host, bdf: str) -> bool:
    """Try the nvidia driver's unbind lock of ``bdf``; whether it was taken (then let go)."""
    path = f"/proc/driver/nvidia/gpus/{bdf}/unbindLock"
    host.platform.write_attribute(host, path, "1")
    taken = host.host(path).read_text().strip() == "1"
    host.platform.write_attribute(host, path, "0")
    return taken


@pytest.fixture
def node(make_node):
    host, store = make_node("rtx-a6000x2")
    load_nvml(host)
    yield host, store
    while N.nvmlLib._initialised:       # whatever a failed test left initialised
        N.nvmlShutdown()


def test_a_handle_holds_its_gpu_until_the_last_shutdown(node):
    host, store = node
    N.nvmlInit()
    assert lock(host, GPU0), "nvmlInit alone opens no GPU"
    N.nvmlDeviceGetHandleByIndex(0)
    assert not lock(host, GPU0) and lock(host, GPU1)
    assert "NVML holds it open" in pcibus.in_use(host.root, store.read(), store.read().gpus[0])
    N.nvmlInit()                 # counted: the first shutdown closes nothing
    N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(1)))
    N.nvmlShutdown()
    assert not lock(host, GPU0) and not lock(host, GPU1)
    N.nvmlShutdown()
    assert lock(host, GPU0) and lock(host, GPU1)


def test_the_unbind_of_a_gpu_nvml_holds_is_refused(node):
    host, _ = node
    N.nvmlInit()
    N.nvmlDeviceGetHandleByPciBusId(GPU0.encode())
    with pytest.raises(OSError) as e:
        host.platform.write_attribute(host, "/sys/bus/pci/drivers/nvidia/unbind", GPU0)
    assert "NVML holds it open" in str(e.value)
    N.nvmlShutdown()
    host.platform.write_attribute(host, "/sys/bus/pci/drivers/nvidia/unbind", GPU0)
    assert not host.host(f"/sys/bus/pci/devices/{GPU0}/driver").exists()


def test_a_process_that_ended_holds_nothing(node):
    host, _ = node
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, pynvml as N\n"
         "from hostagent.sim import fakenvml\n"
         f"fakenvml.install({str(host.root)!r})\n"
         "N.nvmlInit(); N.nvmlDeviceGetHandleByIndex(1)\n"
         "print('open', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        assert lock(host, GPU0) and not lock(host, GPU1)
    finally:
        child.kill()             # no nvmlShutdown: the kernel closes a dead process's files
        child.wait()
    assert lock(host, GPU1)
