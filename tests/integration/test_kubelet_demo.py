"""tests/kubelet_demo.py, the documented command that shows what a kubelet gets from each
plugin with no cluster, prints it: the device plugin's resources and the sample pod's
Allocate, the DRA plugin's slices and NVIDIA's demo claims prepared."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import kubeapi

DEMO = Path(__file__).resolve().parents[1] / "kubelet_demo.py"


def run(plugin: str) -> str:
    done = subprocess.run([sys.executable, str(DEMO), plugin], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, cwd="/")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_the_suite_checks_what_the_test_api_server_is_sent():
    """The demo runs without kubernetes-validate; the suite never does."""
    assert kubeapi.kubernetes_validate is not None


def test_the_device_plugin_demo_shows_the_resources_and_the_sample_pods_allocation():
    out = run("device-plugin")
    assert "Register: nvidia.com/gpu (device plugin API v1beta1)" in out
    assert "ListAndWatch: 8 devices" in out and out.count("  Healthy") == 8
    [preferred] = re.findall(r"GetPreferredAllocation: \['(GPU-[0-9a-f-]+)'\]", out)
    assert f"CDI device   nvidia.com/gpu={preferred}" in out
    assert f"env          NVIDIA_VISIBLE_DEVICES={preferred}" in out
    assert re.search(rf"The agent's allocation: k8s-device-plugin/\S+ -> devices \['{preferred}'\]", out)


@pytest.mark.root("the demo splits GPUs into MIG devices for gpu-test4, which NVML allows root only")
def test_the_dra_demo_prepares_every_one_of_nvidias_claims():
    out = run("dra")
    assert "Registration: driver gpu.nvidia.com, DRA service v1.DRAPlugin" in out
    assert "ResourceSlices of pool node-1: 24 devices" in out      # 4 of them vfio
    demos = re.split(r"\n(?=gpu-test)", out)[1:]
    assert [d.split(":", 1)[0] for d in demos] == ["gpu-test1", "gpu-test2", "gpu-test3", "gpu-test4", "gpu-test5",
                                                  "gpu-test6", "gpu-test-mps", "gpu-test-vfiopci",
                                                  "gpu-test-vfio-config"]
    assert "not allocated" not in out and "error" not in out
    prepared = {d.split(":", 1)[0]: re.findall(r"^    (\S+) +(\S+) +(\S+)$", d, re.M) for d in demos}
    assert len(prepared["gpu-test1"]) == 2 and prepared["gpu-test1"][0][1] != prepared["gpu-test1"][1][1]
    assert len(prepared["gpu-test4"]) == 16 and all(cdi.startswith("nvidia.com/gpu=MIG-")
                                                    for _, _, cdi in prepared["gpu-test4"])
    # gpu-test5: a time-sliced and an MPS GPU, each with the claim's own CDI spec.
    assert {r for r, _, _ in prepared["gpu-test5"]} == {"ts-gpu", "mps-gpu"}
    assert all(cdi.startswith("hostagent.io/allocation=k8s-dra_") for _, _, cdi in prepared["gpu-test5"])
    # gpu-test6: A100s of an even index.
    assert sorted(d for _, d, _ in prepared["gpu-test6"]) == ["gpu-0", "gpu-2", "gpu-4", "gpu-6"]
    # The vfio demos: a whole GPU passed through (one without MIG devices), its own CDI spec.
    for demo in ("gpu-test-vfiopci", "gpu-test-vfio-config"):
        [(request, device, cdi)] = prepared[demo]
        assert request == "gpu" and re.fullmatch(r"gpu-vfio-[0246]", device), prepared[demo]
        assert cdi.startswith("hostagent.io/allocation=k8s-dra_") and cdi.endswith("-" + device.replace("gpu-vfio-", "vfio"))
