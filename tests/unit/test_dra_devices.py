"""The DRA plugin's pool, from simulated nodes' device views: names and attributes as
NVIDIA's driver gives them, PCIe roots and NVLink groups, MIG devices, dynamic MIG partitions and their counters, and
slices that the API server of each version accepts."""

import re
import subprocess

import pytest

from hostagent import model
from hostagent.devices import read_inventory
from hostagent.plugins.dra.devices import build_pool, mig_name, profile_label, semver
from hostagent.plugins.dra.quantity import format_quantity, parse_quantity
from hostagent.plugins.dra.slices import layout
from tests.integration.kubeapi import slice_problems
from tests.rootneeds import GPU_CHANGES

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the [test] extra")


def smi(host, *args):
    subprocess.run([str(host.root / "usr/bin/nvidia-smi"), *args], check=True, capture_output=True)


def views(host):
    """The inventory as the agent renders it (the model), each GPU's MIG profiles apart."""
    inv = read_inventory(host)
    out = model.inventory_devices(inv)
    profiles = {g.uuid: [model.mig_profile(p) for p in g.mig.profiles] for g in inv.gpus if g.mig}
    node = model.node(inv, hostname="node-1", simulated=True)
    return inv, out, profiles, node


def attrs(device):
    return {k: next(iter(v.values())) for k, v in device.attributes.items()}


def valid(pool, version):
    """Every slice of the pool's layout for ``version``, as the API server checks it."""
    specs = layout(pool, "gpu.nvidia.com", "node-1", "node-1", version)
    for i, spec in enumerate(specs):
        spec = {**spec, "pool": {**spec["pool"], "generation": 1, "resourceSliceCount": len(specs)}}
        kv.validate({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                     "metadata": {"name": f"node-1-gpu.nvidia.com-{i:03d}"}, "spec": spec},
                    f"{version[0]}.{version[1]}", strict=True)
        assert slice_problems(spec, version) == []
    return specs


def test_whole_gpus_as_nvidias_driver_names_and_describes_them(make_node):
    host, _ = make_node("dgx-a100")
    inv, devices, profiles, node = views(host)
    pool = build_pool(devices, profiles, node)
    assert [d.name for d in pool.devices] == [f"gpu-{g.minor}" for g in inv.gpus]
    g = inv.gpus[0]
    assert attrs(pool.devices[0]) == {
        "type": "gpu", "uuid": g.uuid, "productName": "NVIDIA A100-SXM4-40GB", "architecture": "Ampere",
        "brand": "Nvidia",
        "cudaComputeCapability": "8.0.0", "driverVersion": "550.90.7", "cudaDriverVersion": "12.4.0",
        "index": 0, "minor": g.minor, "resource.kubernetes.io/pciBusID": "0000:07:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00", "resource.kubernetes.io/numaNode": 3,
        "nvlinkGroup": g.uuid}
    assert pool.devices[0].capacity == {"memory": {"value": "40Gi"}}
    assert pool.devices[0].allocate == {"device": g.uuid} and not pool.counter_sets
    for version in ((1, 34), (1, 35), (1, 36)):
        [spec] = valid(pool, version)
        assert spec["nodeName"] == "node-1" and len(spec["devices"]) == 8


@pytest.mark.parametrize("profile, groups", [
    ("dgx-a100", [[0, 1, 2, 3, 4, 5, 6, 7]]),   # NVSwitches: every GPU reaches every other
    ("dgx1-v100", [[0, 1, 2, 3], [4, 5, 6, 7]]),  # the hybrid cube mesh: two fully linked fours
    ("a30x4", [[0, 1], [2, 3]]),                 # bridged pairs
    ("mixed", [[0, 1]]),                         # GPU 2 has no NVLink
    ("t4x2", []), ("l40s-pcie", [])])
def test_gpus_fully_linked_by_nvlink_share_a_group_and_a_pcie_root_each(make_node, profile, groups):
    host, _ = make_node(profile)
    inv, devices, profiles, node = views(host)
    pool = build_pool(devices, profiles, node)
    by_uuid = {g.uuid: g for g in inv.gpus}
    found: dict[str, list[int]] = {}
    for d in pool.devices:
        a = attrs(d)
        assert a["resource.kubernetes.io/pcieRoot"] == by_uuid[d.uuid].pcie_root
        assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", a["resource.kubernetes.io/pcieRoot"])
        if "nvlinkGroup" in a:
            found.setdefault(a["nvlinkGroup"], []).append(a["index"])
    assert sorted(found.values()) == groups
    for first, members in found.items():
        assert by_uuid[first].index == members[0]


@GPU_CHANGES
def test_a_gpu_in_mig_mode_leaves_its_nvlink_group(make_node):
    host, _ = make_node("a30x4")
    smi(host, "-i", "0", "-mig", "1")
    smi(host, "-r")
    inv, devices, profiles, node = views(host)
    pool = build_pool(devices, profiles, node)
    a = {attrs(d)["index"]: attrs(d) for d in pool.devices if d.kind == "gpu"}
    assert sorted(a) == [1, 2, 3] and "nvlinkGroup" not in a[1]
    assert a[2]["nvlinkGroup"] == a[3]["nvlinkGroup"] == inv.gpus[2].uuid


@GPU_CHANGES
def test_mig_devices_of_a_layout_replace_their_gpu(make_node):
    host, _ = make_node("dgx-a100")
    smi(host, "-i", "0", "-mig", "1")
    smi(host, "-r")
    smi(host, "mig", "-i", "0", "-cgi", "3g.20gb,2g.10gb,1g.5gb,1g.5gb", "-C")
    inv, devices, profiles, node = views(host)
    pool = build_pool(devices, profiles, node)
    gpu = inv.gpus[0]
    names = [d.name for d in pool.devices]
    assert f"gpu-{gpu.minor}" not in names and len(names) == 7 + 4
    migs = [d for d in pool.devices if d.kind == "mig"]
    by_uuid = {d.uuid: d for d in gpu.mig.devices}
    for d in migs:
        record = by_uuid[d.uuid]
        assert d.name == mig_name(gpu.minor, record.profile, record.gi_profile_id, record.placement.start)
        a = attrs(d)
        assert a["type"] == "mig" and a["profile"] == record.profile and a["uuid"] == record.uuid
        assert "nvlinkGroup" not in a and a["resource.kubernetes.io/pcieRoot"] == gpu.pcie_root
        assert (a["parentUUID"], a["parentIndex"], a["parentMinor"]) == (gpu.uuid, 0, gpu.minor)
        assert d.capacity["memory"]["value"] == format_quantity(record.memory_mib * 2 ** 20)
        assert d.capacity["multiprocessors"]["value"] == str(record.multiprocessors)
        start, size = record.placement.start, record.placement.size
        slices = {f"memorySlice{i}" for i in range(start, start + size)}
        assert set(d.capacity) == {"multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines",
                                   "ofaEngines", "memory"} | slices
        assert d.consumes is None and d.allocate == {"device": d.uuid}
    assert sorted(attrs(d)["profile"] for d in migs) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    valid(pool, (1, 34))


@GPU_CHANGES
def test_dynamic_mig_offers_every_free_placement_and_counts_what_each_takes(make_node):
    host, _ = make_node("dgx-a100")
    for gpu in ("0", "1"):
        smi(host, "-i", gpu, "-mig", "1")
    smi(host, "-r")
    smi(host, "mig", "-i", "1", "-cgi", "3g.20gb", "-C")          # at 4: slices 4-7 taken
    inv, devices, profiles, node = views(host)
    pool = build_pool(devices, profiles, node, dynamic_mig=True)
    empty, half = inv.gpus[0], inv.gpus[1]
    offered = [d for d in pool.devices if d.gpu == empty.uuid]
    placements = sum(len(p.placements) for p in empty.mig.profiles)
    assert len(offered) == placements and all(d.kind == "partition" and d.uuid is None for d in offered)
    one = next(d for d in offered if d.name == f"gpu-{empty.minor}-mig-1g5gb-19-3")
    assert one.allocate == {"mig": {"gpu": empty.uuid, "profile": "1g.5gb", "start": 3}}
    assert "uuid" not in attrs(one) and attrs(one)["parentUUID"] == empty.uuid
    counters = one.consumes["counters"]
    assert one.consumes["counterSet"] == f"gpu-{empty.minor}-counter-set"
    assert {k: v["value"] for k, v in counters.items()} == {
        "multiprocessors": "14", "copy-engines": "1", "decoders": "0", "encoders": "0", "jpeg-engines": "0",
        "ofa-engines": "0", "memory": "4864Mi", "compute-slices": "1", "memory-slice-3": "1"}
    whole = next(d for d in offered if attrs(d)["profile"] == "7g.40gb")
    assert {k for k in whole.consumes["counters"] if k.startswith("memory-slice-")} == {
        f"memory-slice-{i}" for i in range(8)}
    sets = {s.name: {k: v["value"] for k, v in s.counters.items()} for s in pool.counter_sets}
    assert sets[f"gpu-{empty.minor}-counter-set"]["compute-slices"] == "7"
    assert sets[f"gpu-{empty.minor}-counter-set"]["jpeg-engines"] == "1"    # one +me instance at a time
    # The 3g.20gb made by hand is published as itself; what overlaps it is not offered, and
    # its share of the GPU is not in the counters.
    mine = [d for d in pool.devices if d.gpu == half.uuid]
    [static] = [d for d in mine if d.kind == "mig"]
    assert static.name == f"gpu-{half.minor}-mig-3g20gb-9-4" and attrs(static)["uuid"] == half.mig.devices[0].uuid
    for d in mine:
        if d.kind == "partition":
            last = max(int(k.rsplit("-", 1)[1]) for k in d.consumes["counters"] if k.startswith("memory-slice-"))
            assert last < 4, d.name
    half_set = sets[f"gpu-{half.minor}-counter-set"]
    assert half_set["compute-slices"] == "4" and "memory-slice-4" not in half_set and "memory-slice-3" in half_set
    # Other GPUs stay whole; every layout is one the API server of its version takes.
    assert [d.name for d in pool.devices if d.kind == "gpu"] == [f"gpu-{g.minor}" for g in inv.gpus[2:]]
    combined = valid(pool, (1, 34))
    # The GPUs and the MIG device made by hand consume no counters: one slice; each GPU's
    # partitions with (1.34) or after (1.35+) its counter set.
    assert [(len(s.get("devices") or ()), len(s.get("sharedCounters") or ())) for s in combined] == [
        (7, 0), (placements, 1), (len(mine) - 1, 1)]
    split = valid(pool, (1, 35))
    assert [(len(s.get("devices") or ()), len(s.get("sharedCounters") or ())) for s in split] == [
        (0, 2), (7, 0), (placements, 0), (len(mine) - 1, 0)]
    assert valid(pool, (1, 36)) == split                     # beta from 1.36: the same layout


@GPU_CHANGES
def test_a_claims_device_stands_as_its_partition(make_node):
    """A MIG device made for a claim is published as the partition it was made from: the
    pool does not change when a claim is prepared."""
    host, _ = make_node("dgx-a100")
    smi(host, "-i", "0", "-mig", "1")
    smi(host, "-r")
    inv, devices, profiles, node = views(host)
    before = build_pool(devices, profiles, node, dynamic_mig=True)
    smi(host, "mig", "-i", "0", "-cgi", "2g.10gb", "-C")
    inv, devices, profiles, node = views(host)
    [made] = inv.gpus[0].mig.devices
    after = build_pool(devices, profiles, node, dynamic_mig=True,
                       made={made.uuid: (inv.gpus[0].uuid, "2g.10gb", made.placement.start)})
    assert layout(after, "gpu.nvidia.com", "n", "n", (1, 35)) == layout(before, "gpu.nvidia.com", "n", "n", (1, 35))
    # Its health is the made device's now.
    name = f"gpu-{inv.gpus[0].minor}-mig-2g10gb-14-{made.placement.start}"
    [partition] = [d for d in after.devices if d.name == name]
    assert partition.health_of == made.uuid
    as_static = build_pool(devices, profiles, node, dynamic_mig=True)
    assert as_static != before and any(d.uuid == made.uuid for d in as_static.devices)


@GPU_CHANGES
def test_partial_compute_instances_get_names_of_their_own(make_node):
    host, _ = make_node("dgx-a100")
    smi(host, "-i", "0", "-mig", "1")
    smi(host, "-r")
    smi(host, "mig", "-i", "0", "-cgi", "2g.10gb")
    inv = read_inventory(host)
    gi = inv.gpus[0].mig.gpu_instances[0]
    smi(host, "mig", "-i", "0", "-gi", str(gi.id), "-cci", "1c.2g.10gb,1c.2g.10gb")
    inv, devices, profiles, node = views(host)
    pool = build_pool(devices, profiles, node)
    names = sorted(d.name for d in pool.devices if d.kind == "mig")
    minor, start = inv.gpus[0].minor, gi.placement.start
    assert names == [f"gpu-{minor}-mig-1c2g10gb-14-{start}-c0", f"gpu-{minor}-mig-1c2g10gb-14-{start}-c1"]
    assert not pool.problems


def test_profile_labels_semver_and_quantities():
    assert profile_label("1g.5gb+me") == "1g5gb-me" and profile_label("1g.10gb+me.all") == "1g10gb-meall"
    assert profile_label("7g.80gb") == "7g80gb"
    assert semver("535.104.05") == "535.104.5" and semver("8.0") == "8.0.0" and semver("12") == "12.0.0"
    assert semver("550.54.15-beta") is None and semver("") is None and semver(None) is None
    assert [format_quantity(v) for v in (0, 1, 1024, 40 * 2 ** 30, 4864 * 2 ** 20, 1000)] == [
        "0", "1", "1Ki", "40Gi", "4864Mi", "1000"]
    assert [parse_quantity(q) for q in ("10Gi", "512Mi", "1G", "1.5e3", "0.5Ki", 7)] == [
        10 * 2 ** 30, 512 * 2 ** 20, 10 ** 9, 1500, 512, 7]
    with pytest.raises(ValueError):
        parse_quantity("ten gigs")


def test_slices_stay_within_the_api_servers_limits():
    from hostagent.plugins.dra.devices import CounterSet, Pool, Published
    plain = [Published(f"gpu-{i}", "gpu", "u", "u", {"type": {"string": "gpu"}}, {}, {}) for i in range(200)]
    consuming = [Published(f"gpu-0-mig-1g5gb-19-{i}", "partition", "u", "u", {"type": {"string": "mig"}}, {}, {},
                           consumes={"counterSet": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}})
                 for i in range(100)]
    sets = tuple(CounterSet(f"gpu-{i}-counter-set", {"memory-slice-0": {"value": "1"}}) for i in range(10))
    pool = Pool(tuple(plain + consuming), sets)
    specs = layout(pool, "gpu.nvidia.com", "node-1", "node-1", (1, 35))
    # 10 counter sets: 8 and 2; 200 plain devices: 128 and 72; 100 partitions: 64 and 36.
    assert [(len(s.get("sharedCounters") or ()), len(s.get("devices") or ())) for s in specs] == [
        (8, 0), (2, 0), (0, 128), (0, 72), (0, 64), (0, 36)]
    assert [d["name"] for s in specs for d in s.get("devices") or ()] == [d.name for d in plain + consuming]
    for spec in specs:
        assert slice_problems({**spec, "pool": {**spec["pool"], "generation": 1, "resourceSliceCount": len(specs)}},
                              (1, 35)) == []
    # Nothing at all: one empty slice says the driver is there.
    assert layout(Pool(), "gpu.nvidia.com", "node-1", "node-1", (1, 35)) == [
        {"driver": "gpu.nvidia.com", "pool": {"name": "node-1"}, "nodeName": "node-1", "devices": []}]


@GPU_CHANGES
def test_with_passthrough_a_gpu_its_partitions_and_its_vfio_device_draw_on_one_counter(make_node):
    host, _ = make_node("dgx-a100")
    for gpu in ("0", "1"):
        smi(host, "-i", gpu, "-mig", "1")
    smi(host, "-r")
    smi(host, "mig", "-i", "1", "-cgi", "3g.20gb", "-C")          # a MIG device made by hand
    inv, devices, profiles, node = views(host)
    # The agent's node view of the PCI bus (GET /v1/node's vfio), each GPU alone in its group.
    node["vfio"] = {"iommu": True, "iommufd": False, "vfio_pci": True, "gpus": [
        {"index": g.index, "pci_bus_id": g.sysfs_bus_id, "uuid": g.uuid, "device_id": "0x20b0",
         "vendor_id": "0x10de", "product": "GA100 [A100 SXM4 40GB]", "numa_node": 0, "iommu_group": 24 + g.index,
         "addressable_memory": 1 << 36, "driver": "nvidia"} for g in inv.gpus]}
    pool = build_pool(devices, profiles, node, dynamic_mig=True, passthrough=True)
    whole = {s.name: s.counters for s in pool.counter_sets if s.name.startswith("gpu-vfio-")}

    def share(d):
        [taken] = [c for c in (d.consumes, d.shares) if c and c["counterSet"].startswith("gpu-vfio-")]
        return taken["counterSet"], {k: v["value"] for k, v in taken["counters"].items()}
    mig_mode, static = inv.gpus[0], inv.gpus[1]
    partitions = [d for d in pool.devices if d.gpu == mig_mode.uuid and d.kind == "partition"]
    assert partitions and all(share(d) == ("gpu-vfio-0-counter-set", {"whole-gpu": "1"}) for d in partitions)
    # Each partition draws on its MIG set too; the vfio device takes all of the whole-GPU set,
    # so one partition in use keeps the GPU from a VM, and a VM's GPU has no partition free.
    assert all(d.consumes["counterSet"] == f"gpu-{mig_mode.minor}-counter-set" for d in partitions)
    [vfio0] = [d for d in pool.devices if d.name == "gpu-vfio-0"]
    assert share(vfio0) == ("gpu-vfio-0-counter-set", {"whole-gpu": "8"})
    assert {k: v["value"] for k, v in whole["gpu-vfio-0-counter-set"].items()} == {"whole-gpu": "8"}
    # A whole GPU and its vfio device take the same: all of it.
    for g in inv.gpus[2:]:
        [gpu] = [d for d in pool.devices if d.name == f"gpu-{g.minor}"]
        [vfio] = [d for d in pool.devices if d.name == f"gpu-vfio-{g.index}"]
        assert share(gpu) == share(vfio) == (f"gpu-vfio-{g.index}-counter-set", {"whole-gpu": "8"})
    # A GPU with a MIG device made by hand has no vfio device (NVIDIA's driver offers none).
    assert "gpu-vfio-1" not in {d.name for d in pool.devices}
    assert all(not d.shares for d in pool.devices if d.gpu == static.uuid)
    for version in ((1, 34), (1, 35), (1, 36)):
        valid(pool, version)
    # A GPU the IOMMU does not group: no vfio device, and its GPU draws on no set of one.
    node["vfio"]["gpus"][7]["iommu_group"] = None
    pool = build_pool(devices, profiles, node, dynamic_mig=True, passthrough=True)
    [last] = [d for d in pool.devices if d.name == f"gpu-{inv.gpus[7].minor}"]
    assert "gpu-vfio-7" not in {d.name for d in pool.devices} and not last.shares
    valid(pool, (1, 35))
