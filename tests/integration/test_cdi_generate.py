"""Spec generation against simulated nodes: content, problems, refresh, CLI."""

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
from hostagent.errors import UsageError
from hostagent.sim import control
from hostagent.sim.files import create_cap_nodes
from hostagent.sim.node import MIG_ENABLE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="specs read major/minor from real character devices (root)")
SCHEMA = Path(__file__).parents[3] / "shared/reference/cdi-schema"


def mig_layout(store, gpu=0):
    with store.mutate() as s:
        s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
        s.reset_gpu(gpu)
        a = s.create_gi(store.facts, gpu, 9, (0, 4))
        s.create_ci(store.facts, gpu, a.id, 2)
        b = s.create_gi(store.facts, gpu, 14, (4, 2))
        s.create_ci(store.facts, gpu, b.id, 1)


def devices(spec):
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


def test_whole_gpus_mig_devices_and_all(make_node):
    host, store = make_node("mixed")
    mig_layout(store)
    create_cap_nodes(store.root, store.facts)
    gen = generate(host)
    assert gen.problems == () and validate_spec(gen.spec) == []
    devs = devices(gen.spec)
    assert "0" not in devs            # MIG enabled: no whole-GPU entry
    assert {"0:0", "0:4", "1", "2", "all"} <= set(devs)
    paths = [n["path"] for n in devs["0:4"]["deviceNodes"]]
    # gpu0/gi5/access = 3 + 9*5 = 48, ci0 = 49 (read from mig-minors)
    assert paths == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap48", "/dev/nvidia-caps/nvidia-cap49"]
    all_paths = {n["path"] for n in devs["all"]["deviceNodes"]}
    assert all_paths == {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap12",
                         "/dev/nvidia-caps/nvidia-cap13", "/dev/nvidia-caps/nvidia-cap48",
                         "/dev/nvidia-caps/nvidia-cap49"}
    uuid_names = [n for n in devs if n.startswith(("GPU-", "MIG-"))]
    assert len(uuid_names) == 4
    assert gen.spec["cdiVersion"] == "0.5.0"


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
    assert hook["args"][-2:] == ["--folder", "/usr/lib/x86_64-linux-gnu"]
    socket_mount = next(m for m in edits["mounts"] if m["containerPath"].endswith("socket"))
    assert "ro" not in socket_mount["options"] and "noexec" in socket_mount["options"]


def test_missing_capability_node_is_an_error_for_that_device_only(make_node):
    host, store = make_node("dgx-a100")
    mig_layout(store)
    create_cap_nodes(store.root, store.facts)
    os.unlink(host.dev("nvidia-caps/nvidia-cap49"))
    gen = generate(host)
    assert "0:4" not in devices(gen.spec) and "0:0" in devices(gen.spec)
    [problem] = gen.problems
    assert "MIG device 0:4" in problem.message and "gpu0/gi5/ci0/access" in problem.message
    out = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root),
                          "cdi", "generate"], capture_output=True, text=True)
    assert out.returncode == 1 and "0:4" in out.stderr and json.loads(out.stdout)["devices"]


def test_lost_gpu_is_left_out_and_said(make_node):
    host, store = make_node("t4x2")
    control.lose_gpu(store, 1)
    gen = generate(host)
    assert "1" not in devices(gen.spec) and "GPU 1 is left out" in gen.problems[0].message


def test_drm_nodes_and_by_path_links(make_node):
    host, _ = make_node("t4x2")
    bdf = "0000:3b:00.0"
    drm = host.sys(f"bus/pci/devices/{bdf}/drm")
    for name, minor in (("card1", 1), ("renderD128", 128)):
        (drm / name).mkdir(parents=True)
        host.dev("dri").mkdir(exist_ok=True)
        os.mknod(host.dev(f"dri/{name}"), stat.S_IFCHR | 0o660, os.makedev(226, minor))
    dev = devices(generate(host).spec)["0"]
    assert [n["path"] for n in dev["deviceNodes"]] == ["/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128"]
    [hook] = dev["hooks"]
    assert hook["args"][5:] == ["create-symlinks", "--link", f"../card1::/dev/dri/by-path/pci-{bdf}-card",
                                "--link", f"../renderD128::/dev/dri/by-path/pci-{bdf}-render"]


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
    create_cap_nodes(store.root, store.facts)
    change, _ = refresh(host, dry_run=True)
    assert change.written and path.stat().st_mtime_ns == before      # dry run: nothing written
    change, _ = refresh(host)
    assert "3" in change.removed and "3:0" in change.added and "all" in change.changed
    assert sorted(os.listdir(path.parent)) == ["nvidia.com-gpu.json"]


@pytest.mark.skipif(not SCHEMA.is_dir(), reason="the upstream CDI schema (shared/reference) is not beside the checkout")
def test_generated_specs_pass_the_upstream_json_schema(make_node):
    jsonschema = pytest.importorskip("jsonschema")
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7
    host, store = make_node("dgx-a100")
    mig_layout(store)
    create_cap_nodes(store.root, store.facts)
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
    run = lambda *a: subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(host.root), *a],
                                    capture_output=True, text=True)
    assert run("cdi", "refresh").returncode == 0
    listed = run("cdi", "list", "-o", "json")
    names = [d["name"] for d in json.loads(listed.stdout)["devices"]]
    assert names[:2] == ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-" + names[1].split("GPU-")[1]]
    bad = tmp_path / "bad.yaml"
    bad.write_text('cdiVersion: "0.3.0"\nkind: x/gpu\ndevices: []\n')
    out = run("cdi", "validate", str(bad), str(spec_path(host, SpecOptions())))
    assert out.returncode == 1 and "kind: vendor 'x'" in out.stdout and "nvidia.com-gpu.json: valid" in out.stdout
    assert run("cdi", "generate", "--device-name-strategy", "serial").returncode == 2
    written = tmp_path / "out.yaml"
    assert run("cdi", "generate", "--output", str(written)).returncode == 0
    assert written.read_text().startswith('"cdiVersion"') and stat.S_IMODE(written.stat().st_mode) == 0o644
