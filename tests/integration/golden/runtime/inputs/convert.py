#!/usr/bin/env python3
"""Make the golden inputs from `containerd config default` (containerd 1.6 prints version 2):

    containerd config default > containerd-default-v2.toml
    python3 convert.py containerd-default-v2.toml

writes containerd-default-v1.toml (no version key, short plugin ids as containerd 1.x
version 1 files have) and containerd-default-v3.toml (version 3 with containerd 2.x's split
of the CRI plugin into runtime, images and the gRPC server sections).
"""

import re
import sys
from pathlib import Path

import tomlkit

IMAGES_KEYS = ("registry", "image_decryption", "max_concurrent_downloads", "image_pull_progress_timeout",
               "disable_snapshot_annotations", "discard_unpacked_layers", "snapshotter")
SERVER_KEYS = ("disable_tcp_service", "stream_idle_timeout", "stream_server_address", "stream_server_port",
               "enable_tls_streaming", "x509_key_pair_streaming")


def v1(text: str) -> str:
    text = re.sub(r'(?m)^version = 2\n', "", text)
    return re.sub(r'plugins\."io\.containerd\.[a-z]+\.v[0-9]+\.([A-Za-z0-9_-]+)"', r"plugins.\1", text)


def v3(text: str) -> str:
    doc = tomlkit.parse(text)
    doc["version"] = 3
    plugins = doc["plugins"]
    cri = plugins["io.containerd.grpc.v1.cri"].unwrap()
    images = {k: cri.pop(k) for k in IMAGES_KEYS if k in cri}
    for k in ("snapshotter", "disable_snapshot_annotations", "discard_unpacked_layers"):
        if k in cri.get("containerd", {}):
            images[k] = cri["containerd"].pop(k)
    images["pinned_images"] = {"sandbox": cri.pop("sandbox_image", "registry.k8s.io/pause:3.10")}
    server = {k: cri.pop(k) for k in SERVER_KEYS if k in cri}
    del plugins["io.containerd.grpc.v1.cri"]
    plugins["io.containerd.cri.v1.images"] = images
    plugins["io.containerd.cri.v1.runtime"] = cri
    plugins["io.containerd.grpc.v1.cri"] = server
    return tomlkit.dumps(doc)


if __name__ == "__main__":
    src = Path(sys.argv[1])
    text = src.read_text()
    (src.parent / "containerd-default-v1.toml").write_text(v1(text))
    (src.parent / "containerd-default-v3.toml").write_text(v3(text))
