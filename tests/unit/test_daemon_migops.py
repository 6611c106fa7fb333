"""On-demand MIG placement on a simulated node's inventory: best fit, never moving existing
instances; removal plans; what a plan takes away."""

import subprocess

import pytest

from hostagent.daemon.migops import NoRoom, affected_devices, place_instance, remove_instance
from hostagent.devices import read_inventory
from hostagent.errors import NotFoundError, StateError, UsageError
from tests.rootneeds import GPU_CHANGES


def smi(host, *args):
    subprocess.run([str(host.root / "usr/bin/nvidia-smi"), *args], check=True, capture_output=True)


@pytest.fixture
def node(make_node):
    host, _ = make_node("dgx-a100")
    for gpu in ("0", "1", "2"):
        smi(host, "-i", gpu, "-mig", "1")
    smi(host, "-r")
    smi(host, "mig", "-i", "0", "-cgi", "3g.20gb", "-C")              # 3g at 4:4: half free
    smi(host, "mig", "-i", "1", "-cgi", "4g.20gb,2g.10gb", "-C")      # only slices 6-7 free
    return host


@GPU_CHANGES
def test_best_fit_prefers_the_fullest_gpu(node):
    inv = read_inventory(node)
    small = place_instance(inv, "1g.5gb")
    assert small.gpu.index == 1 and small.free_slices == 1         # tightest fit
    big = place_instance(inv, "7g.40gb")
    assert big.gpu.index == 2                                       # the only empty one
    steps = [s.action for s in big.plan.gpus[0].steps]
    assert steps == ["create-gi", "create-ci"]
    assert place_instance(inv, "3g.20gb", "0").gpu.index == 0
    with pytest.raises(NoRoom):
        place_instance(inv, "4g.20gb", "1")
    with pytest.raises(StateError):
        place_instance(inv, "1g.5gb", "5")                          # MIG disabled there
    with pytest.raises(UsageError):
        place_instance(inv, "5g.99gb")
    with pytest.raises(NotFoundError):
        place_instance(inv, "1g.5gb", "GPU-nope")


@GPU_CHANGES
def test_remove_and_affected(node):
    inv = read_inventory(node)
    dev = next(d for d in inv.mig_devices if d.parent_index == 1 and d.profile == "2g.10gb")
    gone, plan = remove_instance(inv, dev.uuid)
    assert gone == dev
    assert [s.action for s in plan.gpus[0].steps] == ["destroy-ci", "destroy-gi"]
    assert affected_devices(inv, plan) == {dev.uuid}
    with pytest.raises(NotFoundError):
        remove_instance(inv, "MIG-nope")
