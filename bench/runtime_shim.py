#!/usr/bin/env python3
"""Container start through hostagent-runtime against runc directly (root, containerd, runc).

A private containerd (own root, state and socket in a temporary directory) runs a
busybox container with `ctr run --rm ... true`, in these variants, alternated round by
round (the order rotates) so machine noise hits all alike:

  runc                      --runc-binary runc: the baseline for a container without GPU
  shim, no request          --runc-binary <installed sh front>: must stay under 1.1x runc
  shim, GPU request         + a cdi.k8s.io annotation for GPU 0 of a simulated DGX A100's
                            spec: the shim's Python part, the CDI edits, and the spec's
                            createContainer hook (links + linker cache)
  shim, GPU, no hooks       the same spec with its hooks removed
  runc, spec, CDI edits     runc directly on the same container with the same CDI edits
                            already applied (the config.json the shim handed runc,
                            recorded once), as a CDI-capable engine would hand it:
                            `ctr run --config`; the fair baseline of "shim, GPU request",
                            target under 1.5x
  runc, spec, no hooks      the same for "shim, GPU, no hooks"
  runc, spec                the plain container's recorded config.json through
                            `ctr run --config`

`ctr run --config` (containerd 1.6) takes the whole spec from the file, not the image's
snapshot, so those variants run on a fresh copy of the unpacked image made in the timed
run (as the native snapshotter copies the image for the others). "runc, spec" against
"runc" shows how close the two ways of starting the same container are.

Prints min and median per variant, each median's ratio to runc's and to its fair
baseline, then the shim's Python part alone: the installed front on a GPU container's
config.json, with a low-level runtime that exits at once.

    sudo python3 bench/runtime_shim.py [--runs 20]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

NS = "hostagent-bench"
IMAGE = "localhost/hostagent-bench:1"


def image_layer() -> bytes:
    """The image's one layer: static busybox and ldconfig."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for d in ("bin", "sbin", "etc/ld.so.conf.d", "dev", "proc", "sys", "tmp", "usr/lib/x86_64-linux-gnu"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        tar.add("/bin/busybox", "bin/busybox")
        tar.add("/sbin/ldconfig", "sbin/ldconfig")
        for applet in ("sh", "true", "ls"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        conf = b"include /etc/ld.so.conf.d/*.conf\n"
        info = tarfile.TarInfo("etc/ld.so.conf")
        info.size = len(conf)
        tar.addfile(info, io.BytesIO(conf))
    return layer.getvalue()


def docker_archive(path: Path, layer_bytes: bytes) -> None:
    """A one-layer docker-archive image, written by hand."""
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin:/sbin"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [IMAGE], "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in ((f"{diff_id}/layer.tar", layer_bytes), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def start_containerd(d: Path) -> tuple[subprocess.Popen, Path]:
    d.mkdir(parents=True, exist_ok=True)
    sock = d / "c.sock"
    (d / "config.toml").write_text(f'version = 2\nroot = "{d}/root"\nstate = "{d}/state"\n'
                                   f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{sock}"\n')
    proc = subprocess.Popen(["containerd", "--config", str(d / "config.toml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while subprocess.run(["ctr", "-a", str(sock), "version"], capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("containerd did not start")
        time.sleep(0.1)
    return proc, sock


def write_specs(node_root: Path, spec_dir: Path) -> tuple[str, str]:
    """The simulated node's spec in ``spec_dir`` (only the shim reads it, through the bench's
    runtime.cdi_spec_dirs), and a copy without hooks under another vendor."""
    from hostagent.cdi.refresh import generate
    from hostagent.cdi.render import render
    from hostagent.cdi.spec import SpecOptions
    from hostagent.sim.platform import simulated_host
    from hostagent.sim.driverroot import create_node
    create_node(node_root, "dgx-a100")
    spec_dir.mkdir()
    kinds = []
    for suffix, strip in (("", False), ("-nohooks", True)):
        vendor = f"bench{suffix}.hostagent.test"
        spec = generate(simulated_host(node_root), SpecOptions(vendor=vendor)).spec
        if strip:
            for edits in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]:
                edits.pop("hooks", None)
        (spec_dir / f"{vendor}-gpu.json").write_text(render(spec))
        kinds.append(spec["kind"])
    return kinds[0], kinds[1]


RECORDER = """#!/bin/sh
# Keep config.json of a create as {out}, then run {target}.
prev=
for a do
    [ "$prev" = --bundle ] && cp "$a/config.json" {out}
    prev=$a
done
exec {target} "$@"
"""


def recorder(tmp: Path, name: str, target: str) -> tuple[Path, Path]:
    """A runtime that records the config.json it is given, then execs ``target``."""
    script, out = tmp / f"record-{name}", tmp / f"{name}.json"
    script.write_text(RECORDER.format(out=out, target=target))
    script.chmod(0o755)
    return script, out


def record_specs(tmp: Path, run, front_config: Path, annotations: dict[str, list[str]]) -> dict:
    """name -> the config.json runc gets for that container: the plain one, and through
    the shim the ones with the CDI edits applied (recorded after the shim)."""
    from hostagent.cli.main import main as hostagent
    runc = shutil.which("runc")
    out = {}
    for name, extra in annotations.items():
        script, spec = recorder(tmp, name, runc)
        binary = script
        if extra:                       # the shim, with the recorder as its low-level runtime
            binary = tmp / f"front-{name}"
            if hostagent(["runtime", "install-shim", "--path", str(binary), "--low-level-runtime", str(script),
                          "--agent-config", str(front_config), "--cache-dir", str(tmp / "cache")]):
                sys.exit("install-shim failed")
        run(binary, extra)
        out[name] = json.loads(spec.read_text())
    return out


def python_part(tmp: Path, kind: str, runs: int) -> list[float]:
    """The front + Python part on a GPU request, with `true` as the low-level runtime."""
    from hostagent.cli.main import main as hostagent
    front = tmp / "front-alone"
    if hostagent(["runtime", "install-shim", "--path", str(front), "--low-level-runtime", shutil.which("true"),
                  "--agent-config", str(tmp / "config.yaml"), "--cache-dir", str(tmp / "cache")]):
        sys.exit("install-shim failed")
    bundle = tmp / "bundle"
    bundle.mkdir()
    config = json.dumps({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}},
                         "root": {"path": "rootfs"}, "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
                         "linux": {}, "annotations": {"cdi.k8s.io/gpu": f"{kind}=0"}})
    times = []
    for _ in range(runs + 2):
        (bundle / "config.json").write_text(config)
        start = time.perf_counter()
        subprocess.run([str(front), "create", "--bundle", str(bundle), "x"], check=True)
        times.append(time.perf_counter() - start)
    return times[2:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    # A SIGTERM (timeout, a CI runner) unwinds like Ctrl-C: containerd is stopped and the
    # temporary directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        sys.exit("needs root (containerd, runc)")
    missing = [t for t in ("containerd", "ctr", "runc") if not shutil.which(t)]
    if missing:
        sys.exit(f"not installed: {', '.join(missing)}")

    from hostagent.cli.main import main as hostagent
    tmp = Path(tempfile.mkdtemp(prefix="hostagent-bench-"))
    proc = None
    try:
        kind, kind_nohooks = write_specs(tmp / "node", tmp / "cdi")
        proc, sock = start_containerd(tmp / "containerd")
        layer = image_layer()
        docker_archive(tmp / "image.tar", layer)
        rootfs = tmp / "rootfs"                          # the image unpacked, for ctr run --config
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            tar.extractall(rootfs)
        subprocess.run(["ctr", "-a", str(sock), "-n", NS, "images", "import", "--snapshotter", "native",
                        str(tmp / "image.tar")], check=True, capture_output=True)
        (tmp / "config.yaml").write_text(f"runtime:\n  cdi_spec_dirs: [{tmp / 'cdi'}]\n  default_kind: {kind}\n")
        front = tmp / "hostagent-runtime"
        if hostagent(["runtime", "install-shim", "--path", str(front), "--agent-config", str(tmp / "config.yaml"),
                      "--cache-dir", str(tmp / "cache")]):
            sys.exit("install-shim failed")
        runc = shutil.which("runc")
        gpu = ["--annotation", f"cdi.k8s.io/gpu={kind}=0"]
        gpu_nohooks = ["--annotation", f"cdi.k8s.io/gpu={kind_nohooks}=0"]

        def run(binary, extra, spec=None) -> float:
            """One `ctr run --rm`: of the image, or (``spec``) of that config.json."""
            name = f"b-{uuid.uuid4().hex[:10]}"
            cmd = ["ctr", "-a", str(sock), "-n", NS, "run", "--rm", "--runc-binary", str(binary)]
            root = tmp / f"rootfs-{name}"
            if spec is None:
                cmd += ["--snapshotter", "native", *extra, IMAGE, name, "true"]
            else:
                spec = dict(spec, root=dict(spec["root"], path=str(root)),
                            linux=dict(spec["linux"], cgroupsPath=f"/{NS}/{name}"))
                path = tmp / "spec.json"
                path.write_text(json.dumps(spec))
                cmd += ["--config", str(path), name]
            start = time.perf_counter()
            if spec is not None:
                # A fresh copy of the image, as the native snapshotter makes for the others.
                shutil.copytree(rootfs, root, symlinks=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
            shutil.rmtree(root, ignore_errors=True)
            if done.returncode != 0:
                sys.exit(f"{' '.join(cmd)}: {done.stderr}")
            return elapsed

        recorded = record_specs(tmp, run, tmp / "config.yaml",
                                {"plain": [], "edits": gpu, "nohooks": gpu_nohooks})
        variants = {
            "runc": (runc, []),
            "shim, no request": (front, []),
            "shim, GPU request": (front, gpu),
            "shim, GPU, no hooks": (front, gpu_nohooks),
            "runc, spec, CDI edits": (runc, [], recorded["edits"]),
            "runc, spec, no hooks": (runc, [], recorded["nohooks"]),
            "runc, spec": (runc, [], recorded["plain"]),
        }
        names = list(variants)
        alone = python_part(tmp, kind, args.runs)
        for name in names:                      # warm caches and .pyc files
            run(*variants[name])
            run(*variants[name])
        samples = {name: [] for name in names}
        for i in range(args.runs):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                samples[name].append(run(*variants[name]))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        for leftover in (f"/run/containerd/runc/{NS}", f"/run/containerd/fifo/{NS}"):   # if empty
            try:
                os.rmdir(leftover)
            except OSError:
                pass

    base = statistics.median(samples["runc"])
    # Each shim variant against runc given the same container: for a GPU request, the
    # config.json with the CDI edits applied (what a CDI-capable engine hands runc).
    fair = {"shim, no request": "runc", "shim, GPU request": "runc, spec, CDI edits",
            "shim, GPU, no hooks": "runc, spec, no hooks"}
    targets = {"shim, no request": 1.1, "shim, GPU request": 1.5}
    print(f"ctr run --rm ... true, {args.runs} runs each, alternated")
    print(f"{'variant':22} {'min ms':>8} {'median ms':>10} {'x runc':>7} {'x same':>7}  target")
    for name, times in samples.items():
        med = statistics.median(times)
        same = f"{med / statistics.median(samples[fair[name]]):7.2f}" if name in fair else " " * 7
        target = f"< {targets[name]}x ({fair[name]})" if name in targets else ""
        print(f"{name:22} {min(times) * 1e3:8.1f} {med * 1e3:10.1f} {med / base:7.2f} {same}  {target}")
    print(f"{'python part alone':22} {min(alone) * 1e3:8.1f} {statistics.median(alone) * 1e3:10.1f}"
          f" {statistics.median(alone) / base:7.2f}          (front + Python on a GPU request, no runc)")
    print("x same: the median against runc running the same container (same CDI edits applied), see above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
