"""podman 4.3.1 (CDI 0.5.x) starts real containers with the generated spec."""

import json
import os
import uuid
from pathlib import Path

import pytest

from hostagent.cdi.refresh import generate
from hostagent.cdi.render import render
from hostagent.cdi.spec import SpecOptions
from hostagent.sim.files import create_cap_nodes
from hostagent.sim.node import MIG_ENABLE

from .conftest import podman_run

LIBDIR = "/usr/lib/x86_64-linux-gnu"
# Inside the container: device nodes with their numbers, the library folder, the cache.
PROBE = ("for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && echo \"node $f $(stat -c '%F %t:%T' $f)\"; done; "
         f"for f in {LIBDIR}/*; do echo \"lib $f -> $(readlink $f)\"; done; ldconfig -p")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from hostagent.hostroot import HostRoot
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
    return HostRoot.simulation(root)


@pytest.fixture(scope="module")
def spec(node):
    """The node's spec under a vendor of its own in /etc/cdi, removed afterwards."""
    vendor = f"e2e-{uuid.uuid4().hex[:8]}.hostagent.test"
    generated = generate(node, SpecOptions(vendor=vendor))
    assert generated.problems == ()
    path = Path("/etc/cdi") / f"{vendor}-gpu.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(generated.spec))
    yield generated.spec
    path.unlink()


def probe(image, device, spec):
    out = podman_run(image, "sh", "-c", PROBE, devices=[f"{spec['kind']}={device}"]).stdout
    nodes = {line.split()[1]: line.split(" ", 2)[2] for line in out.splitlines() if line.startswith("node ")}
    libs = {line.split()[1]: line.split(" -> ")[1] for line in out.splitlines() if line.startswith("lib ")}
    return nodes, libs, out


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
    assert mig == ["1:0", "1:6"]
    nodes, libs, out = probe(podman_image, "1:6", spec)
    assert nodes == expected_nodes(spec, "1:6")
    assert "/dev/nvidia1" in nodes and "/dev/nvidia0" not in nodes
    assert sum(p.startswith("/dev/nvidia-caps/") for p in nodes) == 2
    check_driver_files(libs, out)


def test_all(podman_image, spec):
    nodes, libs, out = probe(podman_image, "all", spec)
    assert nodes == expected_nodes(spec, "all")
    assert {f"/dev/nvidia{i}" for i in range(8)} <= set(nodes)
    check_driver_files(libs, out)


def test_unknown_device_fails_the_start(podman_image, spec):
    proc = podman_run(podman_image, "true", devices=[f"{spec['kind']}=9"], check=False)
    assert proc.returncode != 0 and "unresolvable CDI devices" in proc.stderr
