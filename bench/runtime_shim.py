#!/usr/bin/env python3
"""Container start through hostagent-runtime against runc directly (root, containerd, runc).

A private containerd (own root, state and socket in a temporary directory) runs a
busybox container with `ctr run --rm ... true`, in these variants, alternated round by
round (the order rotates) so machine noise hits all alike:

  runc                      --runc-binary runc: the baseline
  shim, no request          --runc-binary <installed sh front>: must stay under 1.1x
  shim, GPU request         + a cdi.k8s.io annotation for GPU 0 of a simulated DGX A100's
                            spec: the shim's Python part, the CDI edits, and the spec's
                            createContainer hook (links + linker cache): target under 1.5x
  shim, GPU, no hooks       the same spec with its hooks removed: the shim's own cost

Prints min and median per variant and each median's ratio to runc's, then the shim's
Python part alone: the installed front on a GPU container's config.json, with a low-level
runtime that exits at once.

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


def docker_archive(path: Path) -> None:
    """A one-layer docker-archive image: static busybox and ldconfig, written by hand."""
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
    layer_bytes = layer.getvalue()
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


def write_specs(node_root: Path) -> tuple[list[Path], str, str]:
    """The simulated node's spec under a unique vendor in /etc/cdi, and a copy without hooks."""
    from hostagent.cdi.refresh import generate
    from hostagent.cdi.render import render
    from hostagent.cdi.spec import SpecOptions
    from hostagent.hostroot import HostRoot
    from hostagent.sim.driverroot import create_node
    create_node(node_root, "dgx-a100")
    tag = uuid.uuid4().hex[:8]
    kinds, paths = [], []
    for suffix, strip in (("", False), ("-nohooks", True)):
        vendor = f"bench-{tag}{suffix}.hostagent.test"
        spec = generate(HostRoot.simulation(node_root), SpecOptions(vendor=vendor)).spec
        if strip:
            for edits in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]:
                edits.pop("hooks", None)
        path = Path("/etc/cdi") / f"{vendor}-gpu.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(spec))
        paths.append(path)
        kinds.append(spec["kind"])
    return paths, kinds[0], kinds[1]


def python_part(tmp: Path, kind: str, runs: int) -> list[float]:
    """The front + Python part on a GPU request, with `true` as the low-level runtime."""
    from hostagent.cli.main import main as hostagent
    front = tmp / "front-alone"
    if hostagent(["runtime", "install-shim", "--path", str(front), "--low-level-runtime", shutil.which("true"),
                  "--agent-config", str(tmp / "config.yaml")]):
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
    if os.geteuid() != 0:
        sys.exit("needs root (containerd, runc)")
    missing = [t for t in ("containerd", "ctr", "runc") if not shutil.which(t)]
    if missing:
        sys.exit(f"not installed: {', '.join(missing)}")

    from hostagent.cli.main import main as hostagent
    tmp = Path(tempfile.mkdtemp(prefix="hostagent-bench-"))
    specs, proc = [], None
    try:
        specs, kind, kind_nohooks = write_specs(tmp / "node")
        proc, sock = start_containerd(tmp / "containerd")
        docker_archive(tmp / "image.tar")
        subprocess.run(["ctr", "-a", str(sock), "-n", NS, "images", "import", "--snapshotter", "native",
                        str(tmp / "image.tar")], check=True, capture_output=True)
        (tmp / "config.yaml").write_text(f"runtime:\n  default_kind: {kind}\n")
        front = tmp / "hostagent-runtime"
        if hostagent(["runtime", "install-shim", "--path", str(front), "--agent-config", str(tmp / "config.yaml")]):
            sys.exit("install-shim failed")
        runc = shutil.which("runc")
        variants = {
            "runc": (runc, []),
            "shim, no request": (front, []),
            "shim, GPU request": (front, ["--annotation", f"cdi.k8s.io/gpu={kind}=0"]),
            "shim, GPU, no hooks": (front, ["--annotation", f"cdi.k8s.io/gpu={kind_nohooks}=0"]),
        }

        def run(binary, extra) -> float:
            cmd = ["ctr", "-a", str(sock), "-n", NS, "run", "--rm", "--snapshotter", "native",
                   "--runc-binary", str(binary), *extra, IMAGE, f"b-{uuid.uuid4().hex[:10]}", "true"]
            start = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
            if done.returncode != 0:
                sys.exit(f"{' '.join(cmd)}: {done.stderr}")
            return elapsed

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
        for path in specs:
            path.unlink(missing_ok=True)
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
    targets = {"shim, no request": 1.1, "shim, GPU request": 1.5}
    print(f"ctr run --rm ... true, {args.runs} runs each, alternated")
    print(f"{'variant':22} {'min ms':>8} {'median ms':>10} {'x runc':>7}  target")
    for name, times in samples.items():
        med = statistics.median(times)
        target = f"< {targets[name]}x" if name in targets else ""
        print(f"{name:22} {min(times) * 1e3:8.1f} {med * 1e3:10.1f} {med / base:7.2f}  {target}")
    print(f"{'python part alone':22} {min(alone) * 1e3:8.1f} {statistics.median(alone) * 1e3:10.1f}"
          f" {statistics.median(alone) / base:7.2f}  (front + Python on a GPU request, no runc)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
