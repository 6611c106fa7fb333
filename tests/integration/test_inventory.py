"""The inventory read through pynvml on every simulated profile, and NVML's edge cases."""

import ctypes
import subprocess
import sys

import pynvml as N
import pytest

from hostagent.devices import nvml_session, read_inventory
from hostagent.errors import DriverNotLoaded, NotFoundError
from hostagent.sim import catalog, control
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.platform import simulated_host

PROFILES = catalog.profile_names()


def enable_mig(store, *indices):
    with store.mutate() as s:
        for i in indices:
            s.set_mig_mode(store.facts, i, MIG_ENABLE)
            if s.gpus[i].mig_current != MIG_ENABLE:
                s.reset_gpu(i)


@pytest.mark.parametrize("profile", PROFILES)
def test_inventory_matches_the_profile(make_node, profile):
    host, store = make_node(profile)
    inv = read_inventory(host)
    spec = catalog.load_profile(profile)
    assert len(inv.gpus) == len(spec.gpus) and not inv.unreadable
    assert inv.driver_version == spec.driver_version
    assert inv.cuda_driver_version == f"{spec.cuda_driver_version // 1000}.{spec.cuda_driver_version % 1000 // 10}"
    assert len({g.uuid for g in inv.gpus}) == len(inv.gpus)
    for gpu, slot in zip(inv.gpus, spec.gpus):
        sku = slot.sku
        assert gpu.name == sku.name and gpu.memory_mib == sku.memory_mib
        assert gpu.sysfs_bus_id == slot.pci_bus_id
        assert gpu.pci_bus_id == "0000" + slot.pci_bus_id.upper()
        assert gpu.compute_capability == "%d.%d" % sku.compute_capability
        assert gpu.architecture == sku.architecture
        assert gpu.uuid.startswith("GPU-") and gpu.serial
        assert gpu.mig_capable == (sku.mig is not None)
        if gpu.mig:
            assert not gpu.mig.enabled and gpu.mig.devices == ()
            # Profiles come from the driver (info.id), with names derived from slices and memory.
            got = {(p.id, p.name, p.slices, p.memory_mib, tuple(pl.start for pl in p.placements))
                   for p in gpu.mig.profiles}
            want = {(p.id, p.name, p.slices, p.memory_mib, p.placements) for p in sku.mig.gi_profiles}
            assert got == want


@pytest.mark.parametrize("profile", [p for p in PROFILES if catalog.load_profile(p).gpus[0].sku.mig])
def test_profile_tables_read_the_same_through_v1_and_versioned_structs(make_node, profile):
    host, store = make_node(profile)
    before = read_inventory(host)          # MIG disabled: unversioned call
    enable_mig(store, 0)
    after = read_inventory(host)           # MIG enabled: ...V call with a v2 struct
    assert before.gpus[0].mig.profiles == after.gpus[0].mig.profiles
    assert after.gpus[0].mig.enabled


def test_profile_ids_are_per_gpu_not_hard_coded(make_node):
    _, a30 = make_node("a30x4")
    host_a30 = simulated_host(a30.root)
    host_a100, _ = make_node("dgx-a100")
    a30_profile = read_inventory(host_a30).gpus[0].mig.profile("1g.6gb")
    a100_profile = read_inventory(host_a100).gpus[0].mig.profile("2g.10gb")
    assert a30_profile.id == a100_profile.id == 14     # same id, different profiles


def test_mig_queries_on_gpu_without_mig_are_not_supported(make_node):
    host, _ = make_node("mixed")
    inv = read_inventory(host)
    t4 = inv.gpus[2]
    assert t4.mig is None and not t4.mig_capable
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(2)
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetMigMode(h)
        assert N.nvmlDeviceGetMaxMigDeviceCount(h) == 0
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)


def test_mig_device_handles_need_mig_mode_enabled(make_node):
    host, _ = make_node("dgx-a100")
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        assert N.nvmlDeviceGetMigMode(h) == [N.NVML_DEVICE_MIG_DISABLE] * 2
        assert N.nvmlDeviceGetMaxMigDeviceCount(h) == 0
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)


def test_instance_lists_write_count_and_fill_a_buffer_of_instance_count(make_node):
    host, store = make_node("hgx-h100")
    enable_mig(store, 0)
    with store.mutate() as s:
        for start in (0, 1, 2):
            gi = s.create_gi(store.facts, 0, 19, (start, 1))
        s.create_ci(store.facts, 0, gi.id, 0)
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        count = ctypes.c_uint(0)                     # never read as the buffer's size
        array = (N.c_nvmlGpuInstance_t * 7)()
        N.nvmlDeviceGetGpuInstances(h, 19, array, ctypes.byref(count))
        assert count.value == 3 and all(array[:3])
        ci_count = ctypes.c_uint(0)
        cis = (N.c_nvmlComputeInstance_t * 1)()
        N.nvmlGpuInstanceGetComputeInstances(array[2], 0, cis, ctypes.byref(ci_count))
        assert ci_count.value == 1 and cis[0]
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstances")
        assert fn(h, 19, None, ctypes.byref(count)) == N.NVML_ERROR_INVALID_ARGUMENT


def test_gpu_instances_are_all_read_when_nvml_reports_too_small_an_instance_count(make_node):
    """A30's NVML reports wrong instanceCount values; a list buffer sized from one too small
    would be overrun (NVML never learns its size). Four 1g.6gb instances exist, then the
    node's facts make NVML report an instanceCount of 1 for that profile."""
    import json
    host, store = make_node("a30x4")
    enable_mig(store, 0)
    with store.mutate() as s:
        for start in range(4):
            gi = s.create_gi(store.facts, 0, 14, (start, 1))
            s.create_ci(store.facts, 0, gi.id, 0)
    facts = json.loads((store.dir / "node.json").read_text())
    (prof,) = [p for p in facts["skus"]["A30-24GB"]["mig"]["gpu_instance_profiles"] if p["id"] == 14]
    prof["instances"] = 1
    (store.dir / "node.json").write_text(json.dumps(facts))
    # Another process reads the edited facts; an overrun there cannot corrupt this one.
    done = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root),
                           "devices", "--profiles", "-o", "json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (gpu0, *_) = doc["gpus"]
    profiles = gpu0["mig"]["profiles"]
    assert [p["instances"] for p in profiles if p["id"] == 14] == [1]   # as NVML says
    assert [g["placement"]["start"] for g in gpu0["mig"]["gpu_instances"]] == [0, 1, 2, 3]
    assert len(gpu0["mig"]["devices"]) == 4 and len(doc["mig_devices"]) == 4


@pytest.mark.parametrize("sku, gi_profile, expected", [
    # CIs of C < G slices have the plain C-slice GPU instance's SMs (mig.md 3.2, 3.5).
    ("hgx-h100", "7g.80gb", {"1c.7g.80gb": 16, "2c.7g.80gb": 32, "3c.7g.80gb": 60,
                             "4c.7g.80gb": 64, "7g.80gb": 132}),
    ("hgx-h100", "1g.20gb", {"1g.20gb": 26}),
    ("dgx-a100", "7g.40gb", {"1c.7g.40gb": 14, "2c.7g.40gb": 28, "3c.7g.40gb": 42,
                             "4c.7g.40gb": 56, "7g.40gb": 98}),
])
def test_compute_instance_sms_follow_the_profile_tables(make_node, sku, gi_profile, expected):
    host, store = make_node(sku)
    enable_mig(store, 0)
    gpu = store.facts.skus[store.read().gpus[0].sku]
    gprof = next(p for p in gpu.mig.gi_profiles if p.name == gi_profile)
    got = {}
    for cprof in gprof.ci_profiles:
        with store.mutate() as s:
            for g in s.gpus[0].gis:
                g.cis.clear()
            s.gpus[0].gis.clear()
            gi = s.create_gi(store.facts, 0, gprof.id)
            s.create_ci(store.facts, 0, gi.id, cprof.id)
        dev, = read_inventory(host).gpus[0].mig.devices
        got[dev.profile] = dev.multiprocessors
    assert got == expected


def test_mig_device_indices_are_dense_and_uuids_stable(make_node):
    host, store = make_node("dgx-a100")
    enable_mig(store, 1)
    with store.mutate() as s:
        gi = s.create_gi(store.facts, 1, 9, (4, 4))            # 3g.20gb at 4:4
        s.create_ci(store.facts, 1, gi.id, 0, (0, 1))          # 1c.3g.20gb
        s.create_ci(store.facts, 1, gi.id, 0, (2, 1))
        s.create_gi(store.facts, 1, 19, (0, 1))                 # 1g.5gb with no CI yet
    inv = read_inventory(host)
    mig = inv.gpus[1].mig
    assert [d.index for d in mig.devices] == [0, 1]           # dense, not the compute slices 4, 6
    assert [d.name for d in mig.devices] == ["1:0", "1:1"]
    assert [(d.gi, d.ci) for d in mig.devices] == [(gi.id, 0), (gi.id, 1)]
    assert {d.profile for d in mig.devices} == {"1c.3g.20gb"}
    assert all(d.uuid.startswith("MIG-") and d.parent_uuid == inv.gpus[1].uuid for d in mig.devices)
    assert mig.devices[0].placement.start == 4 and mig.devices[1].ci_placement.start == 2
    assert sorted((g.placement.start, g.profile, len(g.compute_instances)) for g in mig.gpu_instances) == \
        [(0, "1g.5gb", 0), (4, "3g.20gb", 2)]
    with nvml_session(host):
        # Past the devices NOT_FOUND, past the maximum INVALID_ARGUMENT.
        h = N.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(N.NVMLError_NotFound):
            N.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetMigDeviceHandleByIndex(h, 7)
        # MIG UUIDs resolve to MIG handles whose nvmlDeviceGetIndex is their MIG device index.
        m = N.nvmlDeviceGetHandleByUUID(mig.devices[1].uuid.encode())
        assert N.nvmlDeviceIsMigDeviceHandle(m).value == 1
        assert N.nvmlDeviceGetIndex(m) == 1
    assert read_inventory(host).gpus[1].mig.devices == mig.devices
    assert inv.find("1:1") == mig.devices[1] and inv.find(mig.devices[0].uuid) == mig.devices[0]


def test_versioned_struct_with_wrong_version_is_rejected(make_node):
    host, store = make_node("dgx-a100")
    enable_mig(store, 0)
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        info = N.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.version = 0
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
        assert fn(h, 0, ctypes.byref(info)) == N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_placements_are_listed_whatever_the_mode(make_node):
    host, _ = make_node("dgx-a100")
    with nvml_session(host):
        h = N.nvmlDeviceGetHandleByIndex(0)
        count = N.c_uint(0)
        N.nvmlDeviceGetGpuInstancePossiblePlacements(h, 14, None, N.byref(count))
        assert count.value == 3
        small = (N.c_nvmlGpuInstancePlacement_t * 1)()
        count = N.c_uint(1)
        with pytest.raises(N.NVMLError_InsufficientSize):
            N.nvmlDeviceGetGpuInstancePossiblePlacements(h, 14, small, N.byref(count))


@pytest.mark.allow_missing_nvml
def test_unimplemented_functions_fail_loudly(make_node):
    host, _ = make_node("t4x2")
    with nvml_session(host):
        with pytest.raises(N.NVMLError_FunctionNotFound):
            N.nvmlDeviceGetFanSpeed(N.nvmlDeviceGetHandleByIndex(0))
        assert "nvmlDeviceGetFanSpeed" in N.nvmlLib.missing


def test_lost_gpu_is_reported_not_hidden(make_node):
    host, store = make_node("dgx-a100")
    control.lose_gpu(store, 3)
    inv = read_inventory(host)
    assert [g.index for g in inv.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert inv.unreadable[0].index == 3 and inv.unreadable[0].nvml_code == N.NVML_ERROR_GPU_IS_LOST
    control.reboot(store)
    assert len(read_inventory(host).gpus) == 8


def test_inventory_reads_its_own_node_after_another_node_installs_its_library(make_node):
    from hostagent.sim import fakenvml
    host_a, _ = make_node("t4x2")
    host_b, _ = make_node("hgx-h100")
    assert len(read_inventory(host_a).gpus) == 2
    fakenvml.install(host_b.root)          # e.g. a test or a tool working on another node
    assert len(read_inventory(host_a).gpus) == 2
    assert N.nvmlLib.store.root == host_a.root


def test_driver_not_loaded_is_a_clear_error(make_node):
    host, store = make_node("t4x2")
    control.set_driver_loaded(store, False)
    with pytest.raises(DriverNotLoaded, match="modprobe nvidia"):
        read_inventory(host)


def test_not_a_simulated_node(tmp_path):
    with pytest.raises(NotFoundError, match="not a simulated node"):
        read_inventory(simulated_host(tmp_path))


def test_missing_nvml_library_is_a_clear_error():
    # A fresh process: this one may have loaded a simulated library with that SONAME.
    probe = "import ctypes\ntry:\n    ctypes.CDLL('libnvidia-ml.so.1')\nexcept OSError:\n    print('absent')"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() != "absent":
        pytest.skip("this host has a real libnvidia-ml.so.1")
    code = ("import pynvml; from hostagent.devices import nvml_session, read_inventory\n"
            "from hostagent.hostroot import HostRoot\n"
            "from hostagent.errors import NvmlLibraryMissing\n"
            "try:\n    read_inventory(HostRoot())\nexcept NvmlLibraryMissing as e:\n    print(e.message)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "libnvidia-ml.so.1 could not be loaded" in out.stdout


def test_other_processes_see_one_node(make_node):
    host, store = make_node("dgx-a100")
    enable_mig(store, 0)
    with store.mutate() as s:
        gi = s.create_gi(store.facts, 0, 0)
        s.create_ci(store.facts, 0, gi.id, 4)
    # Another process (the CLI) holds the MIG device; this process's NVML sees it.
    subprocess.run([sys.executable, "-m", "hostagent.cli.main", "sim", "hold", "0:0",
                    "--root", str(host.root)], check=True, capture_output=True)
    with nvml_session(host):
        gi_handle = N.nvmlDeviceGetGpuInstanceById(N.nvmlDeviceGetHandleByIndex(0), 0)
        ci_handle = N.nvmlGpuInstanceGetComputeInstanceById(gi_handle, 0)
        with pytest.raises(N.NVMLError_InUse):
            N.nvmlComputeInstanceDestroy(ci_handle)
        procs = N.nvmlDeviceGetComputeRunningProcesses_v3(N.nvmlDeviceGetHandleByIndex(0))
        assert len(procs) == 1
    control.release(store)
    assert store.read().processes == []


def rewrite(path, text: str) -> None:
    """Write a read-only sysfs file of a simulated node, as its owner may (root need not)."""
    path.chmod(0o644)
    path.write_text(text)


def test_numa_node_is_read_from_sysfs_through_the_host_root(make_node):
    host, _ = make_node("dgx-a100")
    assert [g.numa_node for g in read_inventory(host).gpus] == [3, 3, 1, 1, 7, 7, 5, 5]    # NPS4
    sysfs = lambda i: host.sys(f"bus/pci/devices/{read_inventory(host).gpus[i].sysfs_bus_id}/numa_node")
    rewrite(sysfs(1), "-1\n")              # the platform reports no NUMA affinity
    sysfs(2).unlink()
    rewrite(sysfs(3), "garbage\n")
    assert [g.numa_node for g in read_inventory(host).gpus][:5] == [3, None, None, None, 7]


def test_numa_node_in_a_gpus_document_matches_its_schema(make_node):
    import json
    from importlib import resources

    import jsonschema

    from hostagent import model
    host, _ = make_node("mixed")
    rewrite(host.sys(f"bus/pci/devices/{read_inventory(host).gpus[2].sysfs_bus_id}/numa_node"), "-1\n")
    doc = json.loads(resources.files("hostagent.api").joinpath("openapi.json").read_text())
    gpu_schema = doc["components"]["schemas"]["Gpu"]["allOf"][1]["properties"]
    views = [model.gpu(g) for g in read_inventory(host).gpus]
    assert [v["numa_node"] for v in views] == [0, 0, None]
    for view in views:
        jsonschema.validate(view["numa_node"], gpu_schema["numa_node"])
