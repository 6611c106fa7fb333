"""The OCI state on stdin and the bundle's config.json: where the container root is.

Both are written by the engine, but they are parsed defensively all the same (bounded
sizes, strict JSON, explicit type checks) so a broken engine or a hand-made call fails
with one clear line before anything is written.
"""

import posix

from .errors import HookError
from .jsonmini import loads

MAX_STATE = 1 << 20          # the state is a few hundred bytes plus annotations
MAX_CONFIG = 16 << 20


def read_state(fd: int = 0) -> dict:
    chunks, size = [], 0
    while True:
        chunk = posix.read(fd, 65536)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_STATE:
            raise HookError(f"OCI state on stdin is larger than {MAX_STATE} bytes; refusing it")
        chunks.append(chunk)
    try:
        state = loads(b"".join(chunks))
    except ValueError as e:
        raise HookError(f"OCI state on stdin is not valid JSON ({e}); is this run as an OCI hook?") from None
    if not isinstance(state, dict):
        raise HookError("OCI state on stdin is not a JSON object")
    return state


def read_bundle(state: dict) -> tuple[str, dict]:
    """(root path, the bundle's config.json). The root is crun's non-standard ``root``
    field, else ``root.path`` from config.json; either is relative to the bundle when not
    absolute (crun 1.8 passes root.path as config.json has it, often ``rootfs``)."""
    bundle = state.get("bundle")
    if not isinstance(bundle, str) or not bundle:
        raise HookError("OCI state has no bundle path")
    if not bundle.startswith("/") or "\0" in bundle:
        raise HookError(f"OCI state bundle {bundle!r} is not an absolute path")
    config = _load_config(f"{bundle.rstrip('/')}/config.json")
    root = state.get("root")
    if root is None:
        spec_root = config.get("root")
        root = spec_root.get("path") if isinstance(spec_root, dict) else None
        if not isinstance(root, str) or not root:
            raise HookError(f"{bundle}/config.json has no root.path")
    if isinstance(root, str) and root and "\0" not in root and not root.startswith("/"):
        root = f"{bundle.rstrip('/')}/{root}"      # relative to the bundle
    if not isinstance(root, str) or not root.startswith("/") or "\0" in root:
        raise HookError(f"container root {root!r} is not an absolute path")
    return root, config


def device_paths(config: dict) -> set[str]:
    """Container paths of the device nodes the engine put in the container
    (``linux.devices[].path``): what CDI injected, plus any ``--device`` of its own."""
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    if not isinstance(devices, list):
        return set()
    return {d["path"] for d in devices if isinstance(d, dict) and isinstance(d.get("path"), str)}


def _load_config(path: str) -> dict:
    try:
        # O_NONBLOCK: a FIFO named config.json must not hang the container start.
        fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NONBLOCK)
    except FileNotFoundError:
        raise HookError(f"bundle config {path} does not exist") from None
    except OSError as e:
        raise HookError(f"cannot open bundle config {path}: {e.strerror}") from None
    try:
        st = posix.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000:
            raise HookError(f"bundle config {path} is not a regular file")
        if st.st_size > MAX_CONFIG:
            raise HookError(f"bundle config {path} is larger than {MAX_CONFIG} bytes")
        data = posix.read(fd, st.st_size + 1)
    finally:
        posix.close(fd)
    try:
        config = loads(data)
    except ValueError as e:
        raise HookError(f"bundle config {path} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise HookError(f"bundle config {path} is not a JSON object")
    return config
