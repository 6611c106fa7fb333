"""podman 4.3.1 (CDI 0.5.x) starts real containers with the generated spec."""

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from hostagent.cdi.refresh import generate
from hostagent.cdi.render import render
from hostagent.cdi.spec import SpecOptions
from hostagent.devices import read_inventory
from hostagent.sim.files import add_drm_nodes, create_cap_nodes
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.platform import simulated_host

from .conftest import PODMAN_FLAGS, host_cdi_spec, import_image, podman_run, require

LIBDIR = "/usr/lib/x86_64-linux-gnu"
# Inside the container: device nodes with their numbers, the library folder, the cache.
PROBE = ("for f in /dev/nvidia* /dev/nvidia-caps/* /dev/dri/*; do [ -c \"$f\" ] && echo \"node $f $(stat -c '%F %t:%T' $f)\"; done; "
         "for f in /dev/dri/by-path/*; do [ -L \"$f\" ] && echo \"by-path $f -> $(readlink $f)\"; done; "
         f"for f in {LIBDIR}/*; do echo \"lib $f -> $(readlink $f)\"; done; ldconfig -p")
# GPUs 0 and 2 have DRM nodes (card<N>, renderD<128+N>), as with the nvidia-drm module loaded.
DRM = {0: 1, 2: 3}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from hostagent.sim.driverroot import create_node
    if os.geteuid() != 0:
        pytest.skip("container engines need root here")
    root = tmp_path_factory.mktemp("node")
    store = create_node(root, "dgx-a100")
    with store.mutate() as s:                      # GPU 1: 3g.20gb at 0:4 and 1g.5gb at 6:1
        s.set_mig_mode(store.facts, 1, MIG_ENABLE)
        s.reset_gpu(1)
        gi = s.create_gi(store.facts, 1, 9, (0, 4))
        s.create_ci(store.facts, 1, gi.id, 2)
        gi = s.create_gi(store.facts, 1, 19, (6, 1))
        s.create_ci(store.facts, 1, gi.id, 0)
    create_cap_nodes(store.root, store.facts)
    host = simulated_host(root)
    gpus = read_inventory(host).gpus
    for index, card in DRM.items():
        add_drm_nodes(root, store.facts, gpus[index].sysfs_bus_id, card)
    return host


@pytest.fixture(scope="module")
def spec(node):
    """The node's spec under a vendor of its own in /etc/cdi, removed afterwards."""
    vendor = f"e2e-{uuid.uuid4().hex[:8]}.hostagent.test"
    generated = generate(node, SpecOptions(vendor=vendor))
    assert generated.problems == ()
    with host_cdi_spec(f"{vendor}-gpu.json", render(generated.spec)):
        yield generated.spec


def probe(image, device, spec):
    out = podman_run(image, "sh", "-c", PROBE, devices=[f"{spec['kind']}={device}"]).stdout
    nodes, libs = probe_output(out)
    return nodes, libs, out


def probe_output(out):
    nodes = {line.split()[1]: line.split(" ", 2)[2] for line in out.splitlines() if line.startswith("node ")}
    libs = {line.split()[1]: line.split(" -> ")[1] for line in out.splitlines() if line.startswith("lib ")}
    return nodes, libs


def by_path(out):
    return {line.split()[1]: line.split(" -> ")[1] for line in out.splitlines() if line.startswith("by-path ")}


def expected_nodes(spec, device):
    edits = next(d for d in spec["devices"] if d["name"] == device)["containerEdits"]
    nodes = edits["deviceNodes"] + spec["containerEdits"]["deviceNodes"]
    return {n["path"]: f"character special file {n['major']:x}:{n['minor']:x}" for n in nodes}


def check_driver_files(libs, out):
    assert libs[f"{LIBDIR}/libcuda.so.550.90.07"] == ""                  # the mounted library
    assert libs[f"{LIBDIR}/libcuda.so.1"] == "libcuda.so.550.90.07"      # SONAME link
    assert libs[f"{LIBDIR}/libcuda.so"] == "libcuda.so.1"                # dev link
    assert libs[f"{LIBDIR}/libnvidia-nvvm.so.4"] == "libnvidia-nvvm.so.550.90.07"
    # The linker cache resolves libcuda.so.1 to the injected library.
    assert f"libcuda.so.1 (libc6,x86-64) => {LIBDIR}/libcuda.so.1" in out


@pytest.mark.parametrize("by", ["index", "uuid"])
def test_whole_gpu_by_index_and_uuid(podman_image, spec, by):
    names = [d["name"] for d in spec["devices"]]
    device = "0" if by == "index" else names[names.index("0") + 1]
    nodes, libs, out = probe(podman_image, device, spec)
    assert nodes == expected_nodes(spec, device)       # exactly these nodes, no other GPU
    check_driver_files(libs, out)


def test_mig_device(podman_image, spec):
    mig = [d["name"] for d in spec["devices"] if d["name"].startswith("1:")]
    assert mig == ["1:0", "1:1"]                        # MIG device indices are dense
    nodes, libs, out = probe(podman_image, "1:1", spec)
    assert nodes == expected_nodes(spec, "1:1")
    # GPU 1's node is /dev/nvidia3 (its device minor); /dev/nvidia1 is GPU 3's.
    assert "/dev/nvidia3" in nodes and "/dev/nvidia1" not in nodes
    assert sum(p.startswith("/dev/nvidia-caps/") for p in nodes) == 2
    check_driver_files(libs, out)


def test_all(podman_image, spec):
    nodes, libs, out = probe(podman_image, "all", spec)
    assert nodes == expected_nodes(spec, "all")
    assert {f"/dev/nvidia{i}" for i in range(8)} <= set(nodes)
    check_driver_files(libs, out)


def test_a_gpu_with_drm_nodes_gets_its_by_path_links_from_the_one_hook(podman_image, spec, node):
    bdf = {i: g.sysfs_bus_id for i, g in enumerate(read_inventory(node).gpus)}
    device = f"{spec['kind']}=0"
    cid = subprocess.run(["podman", "create", *PODMAN_FLAGS, "--device", device, podman_image, "sh", "-c", PROBE],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        run = subprocess.run(["podman", "start", "-a", cid], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        config = subprocess.run(["podman", "inspect", "--format", "{{.OCIConfigPath}}", cid],
                                capture_output=True, text=True, check=True).stdout.strip()
        hooks = json.loads(Path(config).read_text())["hooks"]
    finally:
        subprocess.run(["podman", "rm", "-f", cid], capture_output=True)
    nodes = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("node ")}
    assert {"/dev/dri/card1", "/dev/dri/renderD129"} <= nodes and "/dev/dri/card3" not in nodes
    # GPU 2's links are in the same hook run, but its nodes are not in this container.
    assert by_path(run.stdout) == {f"/dev/dri/by-path/pci-{bdf[0]}-card": "../card1",
                                   f"/dev/dri/by-path/pci-{bdf[0]}-render": "../renderD129"}
    assert [h["args"][5] for h in hooks["createContainer"]] == ["prepare"]       # one hook process
    assert set(hooks) == {"createContainer"}
    check_driver_files(probe_output(run.stdout)[1], run.stdout)


def test_all_gets_every_by_path_link(podman_image, spec, node):
    bdf = {i: g.sysfs_bus_id for i, g in enumerate(read_inventory(node).gpus)}
    _, _, out = probe(podman_image, "all", spec)
    assert by_path(out) == {f"/dev/dri/by-path/pci-{bdf[i]}-{kind}": f"../{name}{n}"
                            for i, card in DRM.items()
                            for kind, name, n in (("card", "card", card), ("render", "renderD", 128 + card))}


def test_unknown_device_fails_the_start(podman_image, spec):
    proc = podman_run(podman_image, "true", devices=[f"{spec['kind']}=9"], check=False)
    assert proc.returncode != 0 and "unresolvable CDI devices" in proc.stderr


# -- Plain edits: no CDI, no hook --------------------------------------------------------

@pytest.fixture(scope="module")
def dynamic_image(tmp_path_factory):
    """busybox plus the host's dynamic loader and libc, and /probe, a program that needs
    libcuda.so.1: what resolves it is the image's own loader, with no linker cache."""
    import shutil
    from hostagent.sim.elf import write_shared_object
    require("podman", "runc", "busybox")
    from tests.programs import installed
    cc = installed("cc", "gcc")
    loader = Path("/lib64/ld-linux-x86-64.so.2")
    if not loader.exists():
        pytest.skip("needs an x86_64 glibc host")
    work = tmp_path_factory.mktemp("dynamic")
    root = work / "rootfs"
    for d in ("bin", "lib64", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "dev", "proc", "sys", "etc"):
        (root / d).mkdir(parents=True)
    shutil.copy2("/bin/busybox", root / "bin/busybox")
    (root / "bin/sh").symlink_to("busybox")
    shutil.copy2(os.path.realpath(loader), root / "lib64" / loader.name)
    shutil.copy2(os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6"), root / "lib/x86_64-linux-gnu/libc.so.6")
    write_shared_object(work / "libcuda.so.1", "libcuda.so.1")
    (work / "probe.c").write_text("int main(void) { return 0; }\n")
    subprocess.run([cc, "-o", str(root / "probe"), str(work / "probe.c"), "-Wl,--no-as-needed", f"-L{work}",
                    "-l:libcuda.so.1"], check=True, capture_output=True)
    yield from import_image(root, "hostagent-e2e-dynamic")


def engine_flags(plain: dict) -> list[str]:
    """The plain edits as podman flags, as a device plugin's AllocateResponse would carry
    them (env, mounts, device specs)."""
    flags = [f"--env={e}" for e in plain["env"]]
    # podman's --device is colon-separated, so a by-path node (pci-0000:07:00.0-card) cannot
    # be spelled there; a plugin passes structured device specs and has no such limit.
    flags += [f"--device={n['hostPath']}:{n['path']}:{n['permissions']}" for n in plain["deviceNodes"]
              if ":" not in n["path"]]
    flags += [f"--volume={m['hostPath']}:{m['containerPath']}" + (":ro" if "ro" in m["options"] else "")
              for m in plain["mounts"]]
    return flags


def test_plain_edits_alone_give_a_working_container_without_cdi_or_hook(dynamic_image, node):
    from hostagent.cdi import transient
    from hostagent.cdi.discover import Discovery
    gpus = read_inventory(node).gpus
    _, plain = transient.build_transient_spec(Discovery(node, read_inventory(node).driver_version), "plain",
                                              [gpus[0]], "/usr/bin/python3")
    assert "hooks" not in plain and "NVIDIA_VISIBLE_DEVICES=void" not in plain["env"]
    bdf = gpus[0].sysfs_bus_id
    assert {"path": f"/dev/dri/by-path/pci-{bdf}-card", "hostPath": str(node.dev("dri/card1")),
            "permissions": "rwm"} in plain["deviceNodes"]
    probe = ("/lib64/ld-linux-x86-64.so.2 --list /probe; /probe && echo probe-ran; "
             "for f in /dev/nvidia* /dev/dri/* /dev/dri/by-path/*; do [ -c $f ] && echo node $f; done; "
             "echo env $NVIDIA_VISIBLE_DEVICES")
    proc = podman_run(dynamic_image, "/bin/sh", "-c", probe, flags=engine_flags(plain))     # asserts exit 0
    assert f"libcuda.so.1 => {LIBDIR}/libcuda.so.1" in proc.stdout and "probe-ran" in proc.stdout
    nodes = {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("node ")}
    assert gpus[0].minor == 2                           # GPU 0's node is /dev/nvidia2
    assert {"/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/dri/card1", "/dev/dri/renderD129"} <= nodes
    assert "/dev/nvidia0" not in nodes
    assert f"env {gpus[0].uuid}" in proc.stdout
