"""Spec generation against simulated nodes: content, problems, refresh, CLI."""

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hostagent.cdi.refresh import generate, refresh, spec_path
from hostagent.cdi.spec import SpecOptions
from hostagent.cdi.validate import validate_spec
from hostagent.devices import read_inventory
from hostagent.errors import UsageError
from hostagent.sim import control
from hostagent.sim.files import add_drm_nodes, create_cap_nodes
from hostagent.sim.node import MIG_ENABLE

SCHEMA = Path(__file__).parents[1] / "data/cdi-schema"      # upstream's, see SOURCE.txt there


def mig_layout(store, gpu=0):
    """Two MIG devices on ``gpu`` (GI 1 at 0:4 and GI 5 at 4:2 on GPU 0, whose ids follow
    their placements: MIG devices 0:0 and 0:1), with their /dev capability nodes."""
    with store.mutate() as s:
        s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
        s.reset_gpu(gpu)
        a = s.create_gi(store.facts, gpu, 9, (0, 4))
        s.create_ci(store.facts, gpu, a.id, 2)
        b = s.create_gi(store.facts, gpu, 14, (4, 2))
        s.create_ci(store.facts, gpu, b.id, 1)
    create_cap_nodes(store.root, store.facts)


def cli(host, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), *args],
                          capture_output=True, text=True)


def devices(spec):
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


def test_whole_gpus_mig_devices_and_all(make_node):
    host, store = make_node("mixed")
    mig_layout(store)
    gen = generate(host)
    assert gen.problems == () and validate_spec(gen.spec) == []
    devs = devices(gen.spec)
    assert "0" not in devs            # MIG enabled: no whole-GPU entry
    assert {"0:0", "0:1", "1", "2", "all"} <= set(devs) and "0:2" not in devs
    paths = [n["path"] for n in devs["0:1"]["deviceNodes"]]
    # gpu0/gi5/access = 3 + 9*5 = 48, ci0 = 49 (read from mig-minors)
    assert paths == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap48", "/dev/nvidia-caps/nvidia-cap49"]
    all_paths = {n["path"] for n in devs["all"]["deviceNodes"]}
    assert all_paths == {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap12",
                         "/dev/nvidia-caps/nvidia-cap13", "/dev/nvidia-caps/nvidia-cap48",
                         "/dev/nvidia-caps/nvidia-cap49"}
    uuid_names = [n for n in devs if n.startswith(("GPU-", "MIG-"))]
    assert len(uuid_names) == 4
    assert gen.spec["cdiVersion"] == "0.5.0"


@pytest.mark.root("it reads a real character device's numbers, which root's node has")
def test_device_nodes_carry_what_the_host_has(make_node):
    host, store = make_node("t4x2")
    os.chmod(host.dev("nvidia1"), 0o600)
    node = devices(generate(host).spec)["1"]["deviceNodes"][0]
    st = os.stat(host.dev("nvidia1"))
    assert node == {"path": "/dev/nvidia1", "hostPath": str(host.dev("nvidia1")), "type": "c",
                    "major": os.major(st.st_rdev), "minor": 1, "fileMode": 0o600, "permissions": "rwm"}


def test_common_edits_have_libraries_links_binaries_ipc_firmware_and_one_hook(make_node):
    host, _ = make_node("dgx-a100")
    edits = generate(host).spec["containerEdits"]
    dests = {m["containerPath"] for m in edits["mounts"]}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07" in dests
    assert "/usr/bin/nvidia-smi" in dests and "/run/nvidia-persistenced/socket" in dests
    assert "/lib/firmware/nvidia/550.90.07/gsp_ga10x.bin" in dests
    assert "/etc/vulkan/icd.d/nvidia_icd.json" in dests
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm",
                                                         "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    [hook] = edits["hooks"]
    assert hook["hookName"] == "createContainer" and hook["args"][:3] == [hook["path"], "-I", "-S"] and hook["args"][5] == "prepare"
    assert hook["env"] and all(not e.startswith(("LD_", "PYTHON")) for e in hook["env"])
    assert "libcuda.so.550.90.07::/usr/lib/x86_64-linux-gnu/libcuda.so.1" in hook["args"]
    assert hook["args"][-4:] == ["--folder", "/usr/lib/x86_64-linux-gnu", "--folder", "/usr/lib/x86_64-linux-gnu/vdpau"]
    socket_mount = next(m for m in edits["mounts"] if m["containerPath"].endswith("socket"))
    assert "ro" not in socket_mount["options"] and "noexec" in socket_mount["options"]


def test_missing_capability_node_is_an_error_for_that_device_only(make_node):
    host, store = make_node("dgx-a100")
    mig_layout(store)
    # GPU 0 has device minor 2 here: /dev/nvidia2 and gpu2/gi5/ci0/access = 3 + 135*2 + 9*5 + 1.
    os.unlink(host.dev("nvidia-caps/nvidia-cap319"))
    gen = generate(host)
    assert "0:1" not in devices(gen.spec) and "0:0" in devices(gen.spec)
    assert devices(gen.spec)["0:0"]["deviceNodes"][0]["path"] == "/dev/nvidia2"
    [problem] = gen.problems
    assert "MIG device 0:1" in problem.message and "gpu2/gi5/ci0/access" in problem.message
    out = cli(host, "cdi", "generate")
    assert out.returncode == 1 and "0:1" in out.stderr and json.loads(out.stdout)["devices"]


def test_missing_mig_minors_fail_each_mig_device_and_keep_whole_gpus(make_node):
    host, store = make_node("mixed")
    mig_layout(store)
    os.unlink(host.proc("driver/nvidia-caps/mig-minors"))
    gen = generate(host)
    assert {"1", "2", "all"} <= set(devices(gen.spec)) and not any(n.startswith("0:") for n in devices(gen.spec))
    assert sorted(p.what for p in gen.problems) == [
        f"MIG device {d} ({u}) is left out: its capability minors are unknown: the driver publishes no MIG "
        f"capability minors" for d, u in sorted((m.name, m.uuid) for m in read_inventory(host).gpus[0].mig.devices)]
    assert all(p.where == str(host.proc("driver/nvidia-caps/mig-minors")) for p in gen.problems)


def enable_mig_everywhere(store, gpus):
    """Every GPU with MIG enabled and no MIG device: nothing can be described."""
    with store.mutate() as s:
        for gpu in range(gpus):
            s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
            s.reset_gpu(gpu)


def test_nothing_to_describe_removes_the_node_spec_and_refresh_says_so(make_node):
    host, store = make_node("a30x4")
    change, _ = refresh(host)
    path = spec_path(host, SpecOptions())
    assert change.created and path.exists()
    uuids = {g.uuid for g in read_inventory(host).gpus}
    enable_mig_everywhere(store, 4)
    change, gen = refresh(host, dry_run=True)
    assert change.empty and change.written and path.exists()            # a dry run removes nothing
    change, gen = refresh(host)
    assert change.empty and change.written and not path.exists()
    assert set(change.removed) == {"0", "1", "2", "3", "all"} | uuids
    assert change.describe() == f"{path}: removed (no GPU or MIG device to describe)"
    assert gen.spec is None and gen.device_names == []
    assert "no GPU or MIG device to describe" in gen.problems[-1].message
    assert "MIG enabled with no MIG devices" in gen.problems[-1].message
    change, _ = refresh(host)
    assert change.empty and not change.written and change.describe().endswith("not written (no GPU or MIG device to describe)")
    assert sorted(os.listdir(path.parent)) == []


def test_cli_on_a_node_with_nothing_to_describe(make_node):
    host, store = make_node("a30x4")
    assert cli(host, "cdi", "refresh").returncode == 0
    enable_mig_everywhere(store, 4)
    out = cli(host, "cdi", "generate")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == ("hostagent: error: there is no GPU or MIG device to describe, and a CDI spec needs at least "
                          "one (every GPU has MIG enabled with no MIG devices: create some with 'hostagent mig apply')\n")
    out = cli(host, "cdi", "refresh")
    assert out.returncode == 1 and "nvidia.com-gpu.json: removed (no GPU or MIG device to describe)" in out.stdout
    assert json.loads(cli(host, "cdi", "list", "-o", "json").stdout)["devices"] == []


def test_a_driver_root_without_the_drivers_libraries_is_an_error(make_node, tmp_path):
    host, _ = make_node("t4x2")
    for root in (tmp_path / "nonexistent", tmp_path):
        out = cli(host, "cdi", "generate", "--driver-root", str(root))
        assert out.returncode == 1 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith(f"hostagent: error: {root}: no driver library (lib*.so.535.183.01)")
        assert "usr/lib/x86_64-linux-gnu" in out.stderr and "--driver-root" in out.stderr


def test_invalid_device_names_are_left_out_at_generation(make_node):
    host, _ = make_node("t4x2")
    inv = read_inventory(host)
    bad = dataclasses.replace(inv, gpus=(dataclasses.replace(inv.gpus[0], uuid="GPU-bad/uuid"), inv.gpus[1]))
    gen = generate(host, inventory=bad)
    assert set(devices(gen.spec)) == {"1", inv.gpus[1].uuid, "all"}
    [problem] = gen.problems
    assert problem.message.startswith("device 'GPU-bad/uuid' is left out: not a valid CDI device name")
    assert validate_spec(gen.spec) == []


def test_graphics_config_files_and_tools_the_reference_mounts(make_node):
    host, _ = make_node("t4x2")
    made = {"usr/share/egl/egl_external_platform.d/09_nvidia_wayland2.json": "/usr/share/egl/egl_external_platform.d/09_nvidia_wayland2.json",
            "usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json": "/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json",
            "usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json": "/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json",
            "usr/share/nvidia/nvoptix.bin": "/usr/share/nvidia/nvoptix.bin",
            "etc/X11/xorg.conf.d/10-nvidia.conf": "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
            "usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf": "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
            "usr/share/vulkan/icd.d/nvidia_icd.x86_64.json": "/etc/vulkan/icd.d/nvidia_icd.x86_64.json",
            "vulkan/implicit_layer.d/nvidia_layers.json": "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
            "usr/bin/nvidia-xconfig": "/usr/bin/nvidia-xconfig"}
    for rel in made:
        path = host.driver(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    mounts = {m["containerPath"]: m["hostPath"] for m in generate(host).spec["containerEdits"]["mounts"]}
    for rel, container_path in made.items():
        assert mounts[container_path] == str(host.driver(rel)), container_path


@pytest.mark.parametrize("driver_version", ["550.90.07", "570.124.06"])
def test_every_library_a_mounted_icd_or_platform_file_names_is_in_the_container(make_node, driver_version):
    """A container given 10_nvidia_wayland.json gets libnvidia-egl-wayland.so.1 (versioned
    1.1.13, not as the driver) with its SONAME link, and GBM's backend link."""
    host, _ = make_node("hgx-h200", driver_version=driver_version)
    edits = generate(host).spec["containerEdits"]
    lib = "/usr/lib/x86_64-linux-gnu"
    mounted = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    [hook] = edits["hooks"]
    links = dict(reversed(a.split("::")) for a in hook["args"] if "::" in a)
    names = 0
    for container_path, host_path in mounted.items():
        if container_path.endswith((".json", ".icd")) and "vulkan/implicit" not in container_path:
            text = Path(host_path).read_text()
            soname = json.loads(text)["ICD"]["library_path"] if text.startswith("{") else text.strip()
            assert f"{lib}/{links[f'{lib}/{soname}']}" in mounted, (container_path, soname)
            names += 1
    assert names == (7 if driver_version.startswith("570") else 5)
    assert links[f"{lib}/gbm/nvidia-drm_gbm.so"] == "../libnvidia-allocator.so.1"
    assert f"{lib}/libnvidia-allocator.so.1" in links
    assert not any("i386" in path for path in mounted)      # 32-bit copies stay on the host


def test_lost_gpu_is_left_out_and_said(make_node):
    host, store = make_node("t4x2")
    control.lose_gpu(store, 1)
    gen = generate(host)
    assert "1" not in devices(gen.spec) and "GPU 1 is left out" in gen.problems[0].message


def hooks_in(spec) -> list[dict]:
    return [h for e in [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
            for h in e.get("hooks", [])]


def test_drm_nodes_go_with_their_gpu_and_the_one_hook_makes_their_by_path_links(make_node):
    host, store = make_node("t4x2")
    gpus = read_inventory(host).gpus
    assert add_drm_nodes(store.root, store.facts, gpus[0].sysfs_bus_id, 1) == ("card1", "renderD129")
    add_drm_nodes(store.root, store.facts, gpus[1].sysfs_bus_id, 2)
    spec = generate(host).spec
    devs = devices(spec)
    assert [n["path"] for n in devs["0"]["deviceNodes"]] == ["/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD129"]
    assert [n["path"] for n in devs["1"]["deviceNodes"]] == ["/dev/nvidia1", "/dev/dri/card2", "/dev/dri/renderD130"]
    assert devs["0"]["deviceNodes"][1]["major"] == 226 and devs["0"]["deviceNodes"][1]["fileMode"] == 0o660
    # One hook process per container, whatever the devices: the common prepare hook carries
    # every GPU's by-path links and makes those whose node the container was given.
    [hook] = hooks_in(spec)
    assert hook is spec["containerEdits"]["hooks"][0] and hook["args"][5] == "prepare"
    args = hook["args"]
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--device-link"]
    bdf0, bdf1 = gpus[0].sysfs_bus_id, gpus[1].sysfs_bus_id
    assert pairs == [f"../card1::/dev/dri/by-path/pci-{bdf0}-card", f"../renderD129::/dev/dri/by-path/pci-{bdf0}-render",
                     f"../card2::/dev/dri/by-path/pci-{bdf1}-card", f"../renderD130::/dev/dri/by-path/pci-{bdf1}-render"]
    assert validate_spec(spec) == []


def test_options_names_and_versions(make_node):
    host, _ = make_node("t4x2")
    spec = generate(host, SpecOptions(name_strategies=("type-index",), all_device=False)).spec
    assert [d["name"] for d in spec["devices"]] == ["gpu0", "gpu1"]
    with pytest.raises(UsageError, match="needs cdiVersion 0.5.0"):
        generate(host, SpecOptions(cdi_version="0.4.0"))
    assert generate(host, SpecOptions(cdi_version="0.6.0")).spec["cdiVersion"] == "0.6.0"
    with pytest.raises(UsageError, match="at least 2 characters"):
        generate(host, SpecOptions(vendor="x"))


def test_refresh_writes_only_changes_atomically_with_mode_0644(make_node):
    host, store = make_node("dgx-a100")
    change, _ = refresh(host)
    path = spec_path(host, SpecOptions())
    assert change.written and change.created and stat.S_IMODE(path.stat().st_mode) == 0o644
    before = path.stat().st_mtime_ns
    change, _ = refresh(host)
    assert not change.written and path.stat().st_mtime_ns == before
    mig_layout(store, gpu=3)
    change, _ = refresh(host, dry_run=True)
    assert change.written and path.stat().st_mtime_ns == before      # dry run: nothing written
    change, _ = refresh(host)
    assert "3" in change.removed and "3:0" in change.added and "all" in change.changed
    assert sorted(os.listdir(path.parent)) == ["nvidia.com-gpu.json"]
    # Same content but a mode rootless engines cannot read: rewritten for the mode.
    os.chmod(path, 0o600)
    text = path.read_text()
    change, _ = refresh(host)
    assert change.written and change.mode_fixed and "mode set to 0644" in change.describe()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_text() == text
    assert not refresh(host)[0].written


def test_refresh_over_a_hand_edited_spec_takes_what_fits(make_node):
    host, store = make_node("a30x4")
    path = spec_path(host, SpecOptions())
    path.parent.mkdir(parents=True, exist_ok=True)
    for old, changed in (('{"devices": 5}', ()), ('{"devices": [{"name": 7}, "x", {"name": "0"}]}', ("0",)),
                         ("not json", ()), ("[]", ())):
        path.write_text(old)
        change, _ = refresh(host)
        assert change.written and not change.created and "1" in change.added, old
        assert change.removed == () and change.changed == changed, old
    path.write_text('{"devices": [{"name": 7}, {"name": "gone"}, {"name": "gone"}]}')
    enable_mig_everywhere(store, 4)
    change, _ = refresh(host)
    assert change.empty and change.removed == ("gone",) and not path.exists()


def test_generated_specs_pass_the_upstream_json_schema(make_node):
    jsonschema = pytest.importorskip("jsonschema")
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7
    host, store = make_node("dgx-a100")
    mig_layout(store)
    for version in ("v0.5.2", "v1.1.0"):
        folder = SCHEMA / version
        defs = json.loads((folder / "defs.json").read_text())
        schema = json.loads((folder / "schema.json").read_text())
        registry = Registry().with_resource("defs.json", Resource.from_contents(defs, default_specification=DRAFT7))
        validator = jsonschema.Draft7Validator(schema, registry=registry)
        validator.validate(generate(host).spec)
        with pytest.raises(jsonschema.ValidationError):      # the oracle can say no
            validator.validate({"cdiVersion": "0.5.0", "kind": "ab/cd", "devices": [{"name": "x"}]})


def test_cli_validate_list_and_bad_input(make_node, tmp_path):
    host, _ = make_node("t4x2")
    assert cli(host, "cdi", "refresh").returncode == 0
    listed = cli(host, "cdi", "list", "-o", "json")
    names = [d["name"] for d in json.loads(listed.stdout)["devices"]]
    assert names[:2] == ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-" + names[1].split("GPU-")[1]]
    bad = tmp_path / "bad.yaml"
    bad.write_text('cdiVersion: "0.3.0"\nkind: x/gpu\ndevices: []\n')
    out = cli(host, "cdi", "validate", str(bad), str(spec_path(host, SpecOptions())))
    assert out.returncode == 1 and "kind: vendor 'x'" in out.stdout and "nvidia.com-gpu.json: valid" in out.stdout
    assert cli(host, "cdi", "generate", "--device-name-strategy", "serial").returncode == 2
    written = tmp_path / "out.yaml"
    assert cli(host, "cdi", "generate", "--output", str(written)).returncode == 0
    assert written.read_text().startswith('"cdiVersion"') and stat.S_IMODE(written.stat().st_mode) == 0o644
    assert cli(host, "cdi", "generate", "--output", str(tmp_path / "out.json")).returncode == 0
    assert json.loads((tmp_path / "out.json").read_text())["kind"] == "nvidia.com/gpu"


@pytest.mark.parametrize("args, code, message", [
    (["--output", "/nonexistent-dir/x.json"], 1, "/nonexistent-dir: the directory for --output /nonexistent-dir/x.json "
                                                 "does not exist (create it first, or write the spec elsewhere)"),
    (["--output", "{tmp}"], 2, "--output {tmp} is a directory (give a file name in it, such as {tmp}/nvidia.com-gpu.json)"),
    (["--output", "{tmp}/x.yml"], 2, "--output {tmp}/x.yml: CDI readers load only files ending in .json or .yaml"),
    (["--output", "{tmp}/spec"], 2, "--output {tmp}/spec: CDI readers load only files ending in .json or .yaml"),
    (["--output", "{tmp}/x.json", "--format", "yaml"], 2, "--output {tmp}/x.json ends in .json but --format is yaml"),
])
def test_cli_generate_output_errors_are_one_line_and_write_nothing(make_node, tmp_path, args, code, message):
    host, _ = make_node("t4x2")
    args = [a.format(tmp=tmp_path) for a in args]
    out = cli(host, "cdi", "generate", *args)
    assert out.returncode == code and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("hostagent: error: " + message.format(tmp=tmp_path)), out.stderr
    assert os.listdir(tmp_path) == []
