"""containerd 1.6 end to end: configured configs load, and containers run through the shim.

A private containerd (own root, state and socket under tmp, no CRI plugin) runs busybox
containers with `ctr run --runc-binary <recorder>`: the recorder keeps config.json as
containerd wrote it, then execs the installed hostagent-runtime front; the front's
low-level runtime is a second recorder that keeps config.json as the shim left it, then
execs runc. The node's CDI spec (a simulated DGX A100, a vendor of its own) is in a spec
folder of the test's own, named in the shim's config; the shim's config cache is under tmp
too (install-shim --cache-dir).
"""

import json
import os
import shutil
import signal
import subprocess
import tomllib
import uuid
from pathlib import Path

import pytest

from hostagent.cdi.refresh import generate
from hostagent.cdi.render import render
from hostagent.cdi.spec import SpecOptions
from hostagent.cli.main import main
from hostagent.sim.platform import simulated_host
from tests.waiting import until

from .conftest import require

INPUTS = Path(__file__).parents[1] / "integration" / "golden" / "runtime" / "inputs"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PROBE = ("for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && echo \"node $f $(stat -c '%t:%T' $f)\"; done; "
         f"for f in {LIBDIR}/*; do echo \"lib $f -> $(readlink $f)\"; done; ldconfig -p || echo no linker cache")
NS = "hostagent-e2e"
RECORDER = """#!/bin/sh
# Keep config.json of every create (as {stage}), then run {target}.
prev= bundle=
for a do
    [ "$prev" = --bundle ] && bundle=$a
    prev=$a
done
[ -n "$bundle" ] && cp "$bundle/config.json" "{record}/{stage}-$(basename "$bundle").json"
exec {target} "$@"
"""


def default_configs() -> dict[int, str]:
    """`containerd config default` of the installed containerd (version 2 for 1.x), and its
    version 1 and 3 forms made as the golden inputs are (inputs/convert.py)."""
    import importlib.util
    proc = subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    spec = importlib.util.spec_from_file_location("convert", INPUTS / "convert.py")
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    return {1: convert.v1(proc.stdout), 2: proc.stdout, 3: convert.v3(proc.stdout)}


def test_configured_default_configs_load(tmp_path, private_run_dir):
    """configure on `containerd config default` (v2) and its v1/v3 forms; containerd accepts each."""
    require("containerd")
    for version, text in default_configs().items():
        d = tmp_path / f"v{version}"
        d.mkdir()
        (d / "config.toml").write_text(text)
        args = ["runtime", "configure", "--runtime", "containerd", "--config", str(d / "config.toml"),
                "--cdi", "--backup-dir", str(tmp_path / "backups" / str(version))]
        assert main(args) == 0
        assert (d / "conf.d/99-hostagent.toml").exists() == (version > 1)     # v1: edited in place
        proc = subprocess.run(["containerd", "--config", str(d / "config.toml"), "config", "dump"],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"v{version}: {proc.stderr}"
        # containerd 1.6 knows the v1/v2 CRI section (and merges the drop-in into it); it has
        # no CDI, so its dump leaves enable_cdi out, and it has no v3 CRI section to show.
        if version < 3:
            assert 'BinaryName = "/usr/local/sbin/hostagent-runtime"' in proc.stdout, f"v{version}"
        if version > 1:
            assert str(d / "conf.d/99-hostagent.toml") in proc.stdout     # the import


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cdi")


@pytest.fixture(scope="module")
def spec(spec_dir, tmp_path_factory):
    from hostagent.sim.driverroot import create_node
    require("containerd", "ctr", "runc", "podman", "busybox")
    root = tmp_path_factory.mktemp("node")
    create_node(root, "dgx-a100")
    vendor = f"e2e-{uuid.uuid4().hex[:8]}.hostagent.test"
    generated = generate(simulated_host(root), SpecOptions(vendor=vendor))
    (spec_dir / f"{vendor}-gpu.json").write_text(render(generated.spec))
    return generated.spec


@pytest.fixture(scope="module")
def containerd(tmp_path_factory):
    require("containerd", "ctr", "runc")
    d = tmp_path_factory.mktemp("containerd")
    sock = d / "c.sock"
    (d / "config.toml").write_text(
        f'version = 2\nroot = "{d}/root"\nstate = "{d}/state"\n'
        f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{sock}"\n')
    log = open(d / "containerd.log", "w")
    proc = subprocess.Popen(["containerd", "--config", str(d / "config.toml")], stdout=log, stderr=subprocess.STDOUT)
    until(lambda: proc.poll() is not None or subprocess.run(["ctr", "-a", str(sock), "version"],
                                                            capture_output=True).returncode == 0,
          20, lambda: (d / "containerd.log").read_text(), interval=0.1)
    assert proc.poll() is None, (d / "containerd.log").read_text()
    yield sock
    subprocess.run(["ctr", "-a", str(sock), "-n", NS, "tasks", "ls"], capture_output=True)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    shutil.rmtree(d / "root", ignore_errors=True)
    for leftover in (f"/run/containerd/runc/{NS}", f"/run/containerd/fifo/{NS}"):   # runc's and ctr's, if empty
        try:
            os.rmdir(leftover)
        except OSError:
            pass


@pytest.fixture(scope="module")
def image(containerd, podman_image, tmp_path_factory):
    """The busybox + ldconfig image, saved by podman as a docker archive, imported into our containerd."""
    tar = tmp_path_factory.mktemp("image") / "image.tar"
    subprocess.run(["podman", "save", "-q", "--format", "docker-archive", "-o", str(tar), podman_image],
                   check=True, capture_output=True)
    subprocess.run(["ctr", "-a", str(containerd), "-n", NS, "images", "import", "--snapshotter", "native", str(tar)],
                   check=True, capture_output=True)
    return podman_image


def recorder(path: Path, stage: str, target: str, record: Path) -> Path:
    path.write_text(RECORDER.format(stage=stage, target=target, record=record))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def shims(spec, spec_dir, tmp_path_factory):
    """Two installed fronts: the default config, and one honouring NVIDIA_VISIBLE_DEVICES for all."""
    d = tmp_path_factory.mktemp("shim")
    record = d / "record"
    record.mkdir()
    runc = recorder(d / "runc-after-shim", "after", shutil.which("runc"), record)
    kind = spec["kind"]
    out = {}
    for name, extra in (("default", ""), ("env", "  accept_env_unprivileged: true\n")):
        config = d / f"{name}.yaml"
        config.write_text(f"runtime:\n  default_kind: {kind}\n  cdi_spec_dirs: [{spec_dir}]\n"
                          f"  log_file: {d}/shim.log\n{extra}")
        front = d / f"hostagent-runtime-{name}"
        assert main(["runtime", "install-shim", "--path", str(front), "--low-level-runtime", str(runc),
                     "--agent-config", str(config), "--cache-dir", str(d / "cache")]) == 0
        out[name] = recorder(d / f"before-{name}", "before", str(front), record)
    return out, record


def ctr_run(sock, image, runc_binary, *args, name=None, check=True):
    name = name or f"c-{uuid.uuid4().hex[:8]}"
    cmd = ["ctr", "-a", str(sock), "-n", NS, "run", "--rm", "--snapshotter", "native",
           "--runc-binary", str(runc_binary), *args, image, name, "sh", "-c", PROBE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return name, proc


def parse(out):
    nodes = {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("node ")}
    libs = {line.split()[1]: line.split(" -> ")[1] for line in out.splitlines() if line.startswith("lib ")}
    return nodes, libs


def expected_nodes(spec, device):
    edits = next(d for d in spec["devices"] if d["name"] == device)["containerEdits"]
    return {n["path"]: f"{n['major']:x}:{n['minor']:x}" for n in edits["deviceNodes"] + spec["containerEdits"]["deviceNodes"]}


def check_gpu(spec, out):
    nodes, libs = parse(out)
    assert nodes == expected_nodes(spec, "0")                      # GPU 0 and the control nodes, nothing else
    assert libs[f"{LIBDIR}/libcuda.so.1"] == "libcuda.so.550.90.07"
    assert libs[f"{LIBDIR}/libcuda.so.550.90.07"] == ""
    assert f"libcuda.so.1 (libc6,x86-64) => {LIBDIR}/libcuda.so.1" in out


def configs(record, name):
    return [(record / f"{stage}-{name}.json").read_bytes() for stage in ("before", "after")]


def test_annotation_request(containerd, image, spec, shims):
    fronts, record = shims
    name, proc = ctr_run(containerd, image, fronts["default"], "--annotation", f"cdi.k8s.io/gpu={spec['kind']}=0")
    check_gpu(spec, proc.stdout)
    before, after = configs(record, name)
    assert json.loads(after)["linux"]["devices"] and before != after


def test_env_request_when_enabled(containerd, image, spec, shims):
    fronts, record = shims
    name, proc = ctr_run(containerd, image, fronts["env"], "--env", "NVIDIA_VISIBLE_DEVICES=0")
    check_gpu(spec, proc.stdout)


def test_env_request_of_a_privileged_container(containerd, image, spec, shims):
    fronts, record = shims
    name, proc = ctr_run(containerd, image, fronts["default"], "--privileged", "--env", "NVIDIA_VISIBLE_DEVICES=0")
    nodes, _ = parse(proc.stdout)
    assert nodes["/dev/nvidia2"] == "c3:2" and "/dev/nvidia0" not in nodes   # GPU 0's minor is 2
    assert "libcuda.so.1 (libc6,x86-64)" in proc.stdout


def test_unprivileged_env_is_ignored_by_default(containerd, image, spec, shims):
    fronts, record = shims
    name, proc = ctr_run(containerd, image, fronts["default"], "--env", "NVIDIA_VISIBLE_DEVICES=0")
    assert parse(proc.stdout)[0] == {} and "libcuda" not in proc.stdout
    before, after = configs(record, name)
    assert before == after


def test_container_without_request_is_untouched(containerd, image, spec, shims):
    fronts, record = shims
    name, proc = ctr_run(containerd, image, fronts["default"])
    assert parse(proc.stdout)[0] == {} and "libcuda" not in proc.stdout
    before, after = configs(record, name)
    assert before == after                                   # byte for byte


def test_missing_device_fails_naming_it(containerd, image, spec, shims):
    fronts, record = shims
    name, proc = ctr_run(containerd, image, fronts["default"], "--annotation", f"cdi.k8s.io/gpu={spec['kind']}=9",
                         check=False)
    assert proc.returncode != 0
    assert f"unresolvable CDI device {spec['kind']}=9" in proc.stderr
    assert f"{spec['kind']}=0" in proc.stderr                 # and the devices that exist
    assert not (record / f"after-{name}.json").exists()       # runc never saw it


GOLDEN = Path(__file__).parents[1] / "integration" / "golden" / "runtime"


def golden_containerd_cases() -> list[str]:
    """The golden outputs containerd 1.6 reads: the configs of version 1 and 2 (it has no
    version 3)."""
    cases = []
    for case in sorted(p.name for p in GOLDEN.iterdir() if p.name.startswith("containerd-")):
        texts = [p.read_text() for p in (GOLDEN / case).iterdir()]
        if not any("version = 3" in t for t in texts):
            cases.append(case)
    return cases


def golden_etc(case: str, etc: Path, binary: str) -> Path:
    """The case's golden files under ``etc`` (their /etc/... paths and the runtime's binary
    moved there and to ``binary``); the main config's path (the case's --config)."""
    for f in (GOLDEN / case).iterdir():
        path = etc / f.name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        text = f.read_text().replace('"/etc/', f'"{etc}/')
        for shipped in ("/usr/local/sbin/hostagent-runtime", "/opt/hostagent/bin/shim"):
            text = text.replace(f'"{shipped}"', f'"{binary}"')
        path.write_text(text)
    return etc / "containerd" / ("main.toml" if case == "containerd-custom-paths" else "config.toml")


@pytest.mark.parametrize("case", golden_containerd_cases())
def test_the_golden_configs_load_in_containerd_and_run_a_container(case, tmp_path, containerd, image, spec, shims):
    """The checked-in outputs themselves (not the code that wrote them): containerd 1.6
    loads each, sees the GPU runtime in its CRI section with the binary it names, and a
    container started through that binary gets its GPU."""
    fronts, record = shims
    main_config = golden_etc(case, tmp_path / "etc", str(fronts["default"]))
    dumped = subprocess.run(["containerd", "--config", str(main_config), "config", "dump"], capture_output=True,
                            text=True, timeout=30)
    assert dumped.returncode == 0, dumped.stderr
    cri = tomllib.loads(dumped.stdout)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    # runc v2's BinaryName, or the legacy linux shim's Runtime.
    binaries = {name: (r.get("options") or {}).get("BinaryName") or (r.get("options") or {}).get("Runtime")
                for name, r in cri["runtimes"].items()}
    name = "gpu" if case == "containerd-custom-paths" else "hostagent"
    assert binaries.get(name) == str(fronts["default"]), binaries
    assert cri["runtimes"][name]["runtime_type"] in ("io.containerd.runc.v2", "io.containerd.runtime.v1.linux")
    _, proc = ctr_run(containerd, image, binaries[name], "--annotation", f"cdi.k8s.io/gpu={spec['kind']}=0")
    check_gpu(spec, proc.stdout)
