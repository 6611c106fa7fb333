"""The generated driver root looks like a real host's."""

import json
import os
import stat

import pytest

from hostagent.errors import StateError
from hostagent.devices import read_inventory
from hostagent.sim import catalog
from hostagent.sim import driverlibs
from hostagent.sim.driverroot import LIB_DIR, create_node
from hostagent.sim.elf import read_soname
from hostagent.sim import control
from hostagent.sim.files import create_cap_nodes
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.platform import simulated_host


def majors(root):
    out = {}
    for line in (root / "proc/devices").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[parts[1]] = int(parts[0])
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="creating character devices needs root")
def test_device_nodes_are_character_devices_with_the_listed_majors(tmp_path):
    create_node(tmp_path, "dgx-a100")
    m = majors(tmp_path)
    for name, (major, minor) in {"nvidia0": (m["nvidia-frontend"], 0), "nvidia7": (195, 7),
                                 "nvidiactl": (195, 255), "nvidia-modeset": (195, 254),
                                 "nvidia-uvm": (m["nvidia-uvm"], 0),
                                 "nvidia-uvm-tools": (m["nvidia-uvm"], 1),
                                 "nvidia-caps/nvidia-cap1": (m["nvidia-caps"], 1)}.items():
        st = os.lstat(tmp_path / "dev" / name)
        assert stat.S_ISCHR(st.st_mode), name
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor), name
    assert read_inventory(simulated_host(tmp_path)).device_nodes == "char"


def test_without_mknod_nodes_are_regular_files_and_the_inventory_says_so(tmp_path):
    create_node(tmp_path, "t4x2", real_nodes=False)
    assert (tmp_path / "dev/nvidia0").is_file()
    assert read_inventory(simulated_host(tmp_path)).device_nodes == "regular-files"


def test_proc_files(tmp_path):
    create_node(tmp_path, "dgx-a100")
    version = (tmp_path / "proc/driver/nvidia/version").read_text()
    assert "Kernel Module  550.90.07" in version
    # GPU 3 (NVML's PCI order) has device minor 1 on this profile, as the driver numbers them.
    info = (tmp_path / "proc/driver/nvidia/gpus/0000:4e:00.0/information").read_text()
    assert "Device Minor: \t 1" in info and "NVIDIA A100-SXM4-40GB" in info
    minors = dict(line.split() for line in (tmp_path / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines())
    assert minors["config"] == "1" and minors["monitor"] == "2"
    assert minors["gpu0/gi0/access"] == "3" and minors["gpu31/gi14/ci7/access"] == "4322"


def test_driver_libraries_are_elf_objects_with_sonames(tmp_path):
    create_node(tmp_path, "hgx-h200")
    version = catalog.load_profile("hgx-h200").driver_version
    libs = driverlibs.libraries(catalog.driver_branch(version))
    assert len(libs) >= 34
    for lib in libs:
        for base, elf_class in ((driverlibs.LIB_DIR, 2), (driverlibs.LIB32_DIR, 1)):
            if elf_class == 1 and not lib.lib32:
                assert not (tmp_path / base / lib.folder / lib.file(version)).exists(), lib
                continue
            folder = tmp_path / base / lib.folder
            real = folder / lib.file(version)
            assert real.read_bytes()[4] == elf_class, real          # EI_CLASS: ELF32 / ELF64
            if elf_class == 2:
                assert read_soname(real) == lib.soname_of(version), real
            else:                   # read_soname reads ELF64 only; test_sim_elf reads these with readelf
                assert lib.soname_of(version).encode() + b"\0" in real.read_bytes(), real
            assert (folder / lib.soname_of(version)).resolve() == real.resolve()
            if lib.dev_link:
                assert os.readlink(folder / f"{lib.stem}.so") == lib.soname_of(version)
    assert os.readlink(tmp_path / LIB_DIR / "libcuda.so") == "libcuda.so.1"
    assert (tmp_path / LIB_DIR / "libnvidia-egl-wayland.so.1.1.13").is_file()
    assert (tmp_path / LIB_DIR / "vdpau/libvdpau_nvidia.so.1").is_symlink()
    assert (tmp_path / LIB_DIR / "gbm/nvidia-drm_gbm.so").resolve() == \
        (tmp_path / LIB_DIR / f"libnvidia-allocator.so.{version}").resolve()
    assert (tmp_path / f"lib/firmware/nvidia/{version}/gsp_ga10x.bin").is_file()
    assert stat.S_ISSOCK(os.lstat(tmp_path / "run/nvidia-persistenced/socket").st_mode)
    for tool in ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-persistenced"):
        assert os.access(tmp_path / "usr/bin" / tool, os.X_OK)


@pytest.mark.parametrize("driver_version", ["550.90.07", "570.124.06"])
def test_every_library_an_icd_or_platform_file_names_exists(tmp_path, driver_version):
    create_node(tmp_path, "hgx-h200", driver_version=driver_version)
    configs = driverlibs.config_files(catalog.driver_branch(driver_version))
    platforms = [rel for rel in configs if rel.startswith("usr/share/egl/egl_external_platform.d/")]
    assert len(platforms) == (4 if driver_version.startswith("570") else 2)
    for rel in configs:
        if not rel.endswith((".json", ".icd")):
            continue
        text = (tmp_path / rel).read_text()
        soname = json.loads(text)["ICD"]["library_path"] if rel.endswith(".json") else text.strip()
        lib = tmp_path / LIB_DIR / soname
        assert lib.is_symlink() and read_soname(lib) == soname, rel


def test_capability_files_follow_instances_and_nodes_are_made_on_request(tmp_path):
    store = create_node(tmp_path, "dgx-a100")
    with store.mutate() as s:
        s.set_mig_mode(store.facts, 6, MIG_ENABLE)
        gi = s.create_gi(store.facts, 6, 9, (0, 4))      # GI 1
        s.create_ci(store.facts, 6, gi.id, 2)             # CI 0
    # GPU 6 has device minor 4, which names its capabilities:
    # gpu4/gi1/access = 3 + 135*4 + 9 = 552; its ci0 = 553
    caps = tmp_path / "proc/driver/nvidia/capabilities/gpu4/mig"
    assert "DeviceFileMinor: 552" in (caps / "gi1/access").read_text()
    assert "DeviceFileMinor: 553" in (caps / "gi1/ci0/access").read_text()
    # Like the real driver, the simulator does not create /dev nodes itself ...
    nodes = lambda: sorted(p.name for p in (tmp_path / "dev/nvidia-caps").iterdir())
    assert nodes() == ["nvidia-cap1", "nvidia-cap2"]
    # ... nvidia-modprobe -f / nvidia-smi do.
    assert create_cap_nodes(tmp_path, store.facts) == [552, 553]
    assert nodes() == ["nvidia-cap1", "nvidia-cap2", "nvidia-cap552", "nvidia-cap553"]
    with store.mutate() as s:
        s.destroy_ci(6, gi.id, 0)
        s.destroy_gi(6, gi.id)
    assert not any((tmp_path / "proc/driver/nvidia/capabilities").rglob("gpu*/mig/**/access"))
    assert not (caps / "gi1").exists()
    assert "nvidia-cap552" in nodes()     # stale nodes stay until someone removes them


def _mig_instance(store, gpu):
    with store.mutate() as s:
        s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
        s.reset_gpu(gpu)
        gi = s.create_gi(store.facts, gpu, 9, (0, 4))
        s.create_ci(store.facts, gpu, gi.id, 2)
    return create_cap_nodes(store.root, store.facts)


def test_reboot_leaves_only_the_fixed_capability_nodes_and_loads_the_driver(tmp_path):
    store = create_node(tmp_path, "dgx-a100")
    assert _mig_instance(store, 2) == [12, 13]          # GPU 2 has device minor 0: gpu0/gi1
    control.set_driver_loaded(store, False)
    control.reboot(store)
    assert sorted(p.name for p in (tmp_path / "dev/nvidia-caps").iterdir()) == ["nvidia-cap1", "nvidia-cap2"]
    state = store.read()
    assert state.driver_loaded and state.gpus[2].mig_current == MIG_ENABLE and state.gpus[2].gis == []
    assert read_inventory(simulated_host(tmp_path)).gpus[2].mig.enabled


def test_driver_reload_drops_instances_and_their_capability_files(tmp_path):
    store = create_node(tmp_path, "hgx-h100")
    _mig_instance(store, 0)
    caps = tmp_path / "proc/driver/nvidia/capabilities/gpu0"
    assert caps.exists()
    control.hold(store, "1", pid=os.getpid())
    with pytest.raises(StateError, match="in use"):
        control.set_driver_loaded(store, False)
    assert store.read().driver_loaded and store.read().gpus[0].gis
    control.release(store)
    control.set_driver_loaded(store, False)
    control.set_driver_loaded(store, True)
    gpu = read_inventory(simulated_host(tmp_path)).gpus[0]
    assert not gpu.mig.enabled and not gpu.mig.pending and not list(caps.rglob("access"))


def test_a_package_upgrade_replaces_every_library_of_the_old_version(tmp_path):
    """The version-mismatch fault upgrades the packages on disk: every folder's libraries
    (vdpau, 32-bit copies) move to the new version, with SONAMEs that carry it, and a
    spec generated after the reload mounts the new set."""
    from hostagent.sim import faults
    store = create_node(tmp_path, "dgx-a100")
    old, new = store.facts.driver_version, "550.127.05"
    faults.inject(store, "mismatch", version=new)
    leftovers = [p for p in tmp_path.glob("usr/lib/**/*")
                 if old in p.name or (p.is_symlink() and old in os.readlink(p))]
    assert leftovers == []
    for lib in driverlibs.libraries(catalog.driver_branch(new)):
        real = tmp_path / LIB_DIR / lib.folder / lib.file(new)
        assert read_soname(real) == lib.soname_of(new), real
        assert (real.parent / lib.soname_of(new)).resolve() == real.resolve()
        if lib.lib32:
            assert (tmp_path / driverlibs.LIB32_DIR / lib.folder / lib.file(new)).is_file()
    assert read_soname(tmp_path / LIB_DIR / f"libnvidia-glcore.so.{new}") == f"libnvidia-glcore.so.{new}"
    faults.clear(store, "mismatch")
    from hostagent.cdi.discover import Discovery
    mounts = {m.container_path for m in Discovery(simulated_host(tmp_path), new).libraries().mounts}
    assert f"/{LIB_DIR}/vdpau/libvdpau_nvidia.so.{new}" in mounts
    assert len(mounts) == 33
