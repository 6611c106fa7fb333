"""Claims that ask for linked GPUs, on the pools of simulated nodes: ``matchAttribute`` on
``gpu.nvidia.com/nvlinkGroup`` gets GPUs that are each NVLinked to every other, and on
``resource.kubernetes.io/pcieRoot`` GPUs under one PCIe root, as the test scheduler (first
fit, backtracking as Kubernetes' allocator does) allocates them from the slices the plugin
would publish."""

import pytest

from hostagent import model
from hostagent.devices import read_inventory
from hostagent.plugins.dra.devices import build_pool
from hostagent.plugins.dra.slices import layout

from .dracluster import DRIVER, NODE

pytest.importorskip("celpy", reason="cel-python is in the [test] extra")
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the [test] extra")

from .drasched import Scheduler, Unschedulable  # noqa: E402
from .kubeapi import TestApiServer  # noqa: E402


def scheduler(host) -> tuple[Scheduler, dict[str, int]]:
    """A test scheduler over the node's pool (not served: the slices are put in place), and
    each device's GPU index."""
    inv = read_inventory(host)
    devices = model.inventory_devices(inv)
    node = model.node(inv, hostname=NODE, simulated=True)
    pool = build_pool(devices, {}, node)
    api = TestApiServer((1, 34))
    specs = layout(pool, DRIVER, NODE, NODE, (1, 34))
    for i, spec in enumerate(specs):
        spec["pool"].update(generation=1, resourceSliceCount=len(specs))
        name = f"{NODE}-{DRIVER}-{i:03d}"
        api.slices[name] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                            "metadata": {"name": name}, "spec": spec}
    return Scheduler(api), {d.name: d.attributes["index"]["int"] for d in pool.devices}


def claim(name: str, count: int, match: str | None = None, selector: str | None = None) -> dict:
    exactly = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    spec = {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}
    if match:
        spec["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": match}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "default", "name": name}, "spec": spec}


def allocate(sched: Scheduler, body: dict, index: dict[str, int]) -> list[int]:
    done = sched.allocate(sched.api.put_claim(body), NODE)
    return sorted(index[r["device"]] for r in done["status"]["allocation"]["devices"]["results"])


def test_nvlink_group_on_a_dgx1_gives_one_fully_linked_four_then_the_other(make_node):
    host, _ = make_node("dgx1-v100")
    sched, index = scheduler(host)
    # GPU 0 is taken; four linked GPUs are then 4-7 (1-3 and 4 are not all linked), where
    # first fit alone would give 1-4.
    assert allocate(sched, claim("one", 1), index) == [0]
    assert allocate(sched, claim("plain", 4), index) == [1, 2, 3, 4]
    sched.api.delete_claim("default", "plain")
    assert allocate(sched, claim("linked", 4, "gpu.nvidia.com/nvlinkGroup"), index) == [4, 5, 6, 7]
    with pytest.raises(Unschedulable):      # 1-3 are left: three, not four
        allocate(sched, claim("more", 4, "gpu.nvidia.com/nvlinkGroup"), index)
    assert allocate(sched, claim("rest", 3, "gpu.nvidia.com/nvlinkGroup"), index) == [1, 2, 3]


def test_gpus_without_nvlink_match_no_nvlink_group(make_node):
    host, _ = make_node("mixed")
    sched, index = scheduler(host)
    # GPUs 0 and 1 are bridged, GPU 2 stands alone: it never joins a linked pair.
    assert allocate(sched, claim("a", 1, selector="device.attributes['gpu.nvidia.com'].index == 0"), index) == [0]
    with pytest.raises(Unschedulable):
        allocate(sched, claim("pair", 2, "gpu.nvidia.com/nvlinkGroup"), index)


def test_pcie_root_keeps_a_pair_under_one_root(make_node):
    host, _ = make_node("dgx-a100")
    sched, index = scheduler(host)
    assert allocate(sched, claim("one", 1), index) == [0]
    # GPU 1 shares GPU 0's root; a pair under one root is then 2 and 3.
    assert allocate(sched, claim("pair", 2, "resource.kubernetes.io/pcieRoot"), index) == [2, 3]
    assert allocate(sched, claim("all", 4, "gpu.nvidia.com/nvlinkGroup"), index) == [1, 4, 5, 6]
