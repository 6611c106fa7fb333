"""``driver verify`` against a simulated node broken in each way a real host breaks."""

import json
import os
import subprocess
import sys

import pytest

from hostagent.driver.verify import verify
from hostagent.sim import control, faults, kmod

# The checks each fault makes fail (and nothing else).
FAILS = {"mismatch": {"version-match", "nvml"}, "no-uvm": {"device-nodes"},
         "nouveau": {"kernel-module", "nouveau", "nvml"}, "unloaded": {"kernel-module", "nvml"},
         "no-firmware": {"gsp-firmware"}, "fm-down": {"fabric"}, "gpu-lost": {"nvml"}}


def failed(host, **kw):
    return {c.name for c in verify(host, **kw).blocking}


def hostagent(*args):
    env = {k: v for k, v in os.environ.items() if k != "HOSTAGENT_SIMULATE"}
    proc = subprocess.run([sys.executable, "-m", "hostagent.cli.main", *map(str, args)],
                          capture_output=True, text=True, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def h100(make_node):
    return make_node("hgx-h100")


def test_every_fault_fails_exactly_its_checks_and_the_fix_clears_it(h100):
    host, store = h100
    assert failed(host) == set()
    for name in faults.FAULTS:
        faults.inject(store, name, gpu=3)
        assert failed(host) == FAILS[name], name
        faults.clear(store, name, gpu=3)
        assert failed(host) == set(), name
    assert set(FAILS) == set(faults.FAULTS)


def test_mismatch_names_both_versions_and_a_reboot_fixes_it(h100):
    host, store = h100
    faults.inject(store, "mismatch", version="550.127.05")
    check = verify(host).check("version-match")
    assert check.summary == ("Driver/library version mismatch: user-space libraries 550.127.05, "
                             "kernel module 550.90.07")
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.127.05: user-space version 550.127.05" in check.evidence
    assert "reboot" in check.fix
    control.reboot(store)                       # the module on disk comes up
    verdict = verify(host)
    assert verdict.usable and verdict.driver_version == "550.127.05"
    assert (host.root / "sys/module/nvidia/version").read_text().strip() == "550.127.05"


def test_a_lost_gpu_is_named_by_its_bus_id(h100):
    host, store = h100
    faults.inject(store, "gpu-lost", gpu=2)
    check = verify(host).check("nvml")
    assert check.evidence == ("GPU 0000:3a:00.0: NVML_ERROR_GPU_IS_LOST (15)",)
    log = verify(host).check("kernel-log")
    assert log.result == "warn" and "Xid 79 on 0000:3a:00" in log.evidence


def test_nouveau_survives_a_reboot_until_blacklisted(h100):
    host, store = h100
    faults.inject(store, "nouveau")
    assert os.readlink(host.root / "sys/bus/pci/devices/0000:18:00.0/driver").endswith("/nouveau")
    assert not (host.root / "proc/driver/nvidia").exists()
    control.reboot(store)
    assert "nouveau" in failed(host)
    (host.root / "etc/modprobe.d").mkdir(parents=True)
    (host.root / "etc/modprobe.d/blacklist-nouveau.conf").write_text("blacklist nouveau\noptions nouveau modeset=0\n")
    control.reboot(store)
    assert failed(host) == set()


def test_unloading_is_refused_while_a_process_holds_a_gpu(h100):
    host, store = h100
    control.hold(store, "0")
    try:
        with pytest.raises(Exception, match="Module nvidia is in use"):
            faults.inject(store, "unloaded")
        assert failed(host) == set()
    finally:
        control.release(store)


def test_without_a_module_on_disk_a_reboot_leaves_the_driver_unloaded(h100):
    host, store = h100
    kmod.module_file(host.root).unlink()
    control.reboot(store)
    check = verify(host).check("kernel-module")
    assert check.result == "fail" and "no nvidia module on disk for kernel 6.1.0-28-amd64" in " ".join(check.evidence)


def test_cli_exit_codes_table_and_json(h100):
    host, store = h100
    ok = hostagent("--simulate", host.root, "driver", "verify")
    assert ok.returncode == 0 and "driver usable: 550.90.07, CUDA 12.4" in ok.stdout
    assert "persistence     warn" in ok.stdout       # no nvidia-persistenced on a new node
    faults.inject(store, "fm-down")
    bad = hostagent("--simulate", host.root, "driver", "verify", "-o", "json")
    data = json.loads(bad.stdout)
    assert bad.returncode == 1 and data["usable"] is False and data["failed"] == ["fabric"]
    fabric = next(c for c in data["checks"] if c["name"] == "fabric")
    assert "fabric not started" in " ".join(fabric["evidence"]) and "nvidia-fabricmanager" in fabric["fix"]
    assert hostagent("--simulate", host.root, "driver", "verify", "--ignore", "fabric").returncode == 0
    wrong = hostagent("--simulate", host.root, "driver", "verify", "--ignore", "fabrik")
    assert wrong.returncode == 2 and "no check named fabrik" in wrong.stderr
    sim = hostagent("--simulate", host.root, "sim", "fault", "fm-down", "--clear")
    assert sim.returncode == 0 and "fabric manager started" in sim.stdout
    assert hostagent("--simulate", host.root, "driver", "verify").returncode == 0
