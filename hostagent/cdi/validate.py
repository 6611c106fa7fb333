"""CDI spec validation: the CDI library's rules (strict fields, names, versions, edits)
with a precise location for every problem.
"""

from __future__ import annotations

import os

from ..errors import ConfigError, UsageError
from .version import KNOWN_VERSIONS, minimum_version, version_key

__all__ = ["check_kind", "validate_spec", "load_spec_file", "read_spec", "VENDOR_RE", "CLASS_RE", "DEVICE_RE"]



class _NameRule:
    """A CDI name rule, used like a compiled pattern (``match``), checked with character
    sets: the runtime shim validates specs at every GPU create, where importing re (with
    enum and functools) would cost ~10 ms.

    ``first`` character, then ``inner`` ones, and a letter or digit last."""
    _ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")

    def __init__(self, first: str, inner: str):
        self.first, self.inner = frozenset(first), frozenset(inner)

    def match(self, name: str) -> bool:
        return bool(name) and name[0] in self.first and name[-1] in self._ALNUM and \
            all(c in self.inner for c in name[1:-1])


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# ^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$ and ^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$
VENDOR_RE = _NameRule(_LETTERS, _LETTERS + "0123456789_.-")
CLASS_RE = VENDOR_RE
DEVICE_RE = _NameRule(_LETTERS + "0123456789", _LETTERS + "0123456789_.:-")
# SPEC.md's limits (a DNS-subdomain vendor, a DNS-label class); the Go code enforces none.
MAX_VENDOR, MAX_CLASS = 253, 63
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")

# Fields each object may carry, and the cdiVersion that introduced the newer ones.
SPEC_FIELDS = {"cdiVersion": "0.3.0", "kind": "0.3.0", "devices": "0.3.0", "containerEdits": "0.3.0",
               "annotations": "0.6.0"}
DEVICE_FIELDS = {"name": "0.3.0", "containerEdits": "0.3.0", "annotations": "0.6.0"}
EDITS_FIELDS = {"env": "0.3.0", "deviceNodes": "0.3.0", "hooks": "0.3.0", "mounts": "0.3.0",
                "intelRdt": "0.7.0", "additionalGids": "0.7.0", "netDevices": "1.1.0"}
NODE_FIELDS = {"path": "0.3.0", "type": "0.3.0", "major": "0.3.0", "minor": "0.3.0", "fileMode": "0.3.0",
               "permissions": "0.3.0", "uid": "0.3.0", "gid": "0.3.0", "hostPath": "0.5.0"}
MOUNT_FIELDS = {"hostPath": "0.3.0", "containerPath": "0.3.0", "options": "0.3.0", "type": "0.4.0"}
HOOK_FIELDS = {"hookName": "0.3.0", "path": "0.3.0", "args": "0.3.0", "env": "0.3.0", "timeout": "0.3.0"}


def check_kind(kind: str) -> None:
    """Raise UsageError unless ``kind`` is ``vendor/class`` with valid parts of 2+ characters
    (one-character parts crash every released CDI library)."""
    problems = _kind_problems(kind, "kind")
    if problems:
        raise UsageError(problems[0])


def _kind_problems(kind, where: str) -> list[str]:
    if not isinstance(kind, str) or "/" not in kind:
        return [f"{where}: {kind!r} is not of the form vendor/class"]
    vendor, cls = kind.split("/", 1)
    out = []
    for part, value, limit in (("vendor", vendor, MAX_VENDOR), ("class", cls, MAX_CLASS)):
        if len(value) < 2:
            out.append(f"{where}: {part} {value!r} must have at least 2 characters")
        elif len(value) > limit:
            out.append(f"{where}: {part} has {len(value)} characters; the CDI specification allows at most {limit}")
        elif not VENDOR_RE.match(value):
            out.append(f"{where}: {part} {value!r} must start with a letter, end with a letter or digit, "
                       "and contain only letters, digits, '_', '.' and '-'")
    return out


def validate_spec(spec) -> list[str]:
    """Every problem in ``spec`` (a parsed document), each prefixed with where it is."""
    if not isinstance(spec, dict):
        return ["the spec is not a mapping"]
    out: list[str] = []
    version = spec.get("cdiVersion")
    out += _fields(spec, SPEC_FIELDS, "spec", version)
    if not isinstance(version, str) or version.removeprefix("v") not in KNOWN_VERSIONS:
        out.append(f"cdiVersion: {version!r} is not a known CDI version ({', '.join(KNOWN_VERSIONS)})")
        version = None
    elif version.startswith("v"):
        out.append(f"cdiVersion: {version!r} has a leading 'v', which older readers reject")
    out += _kind_problems(spec.get("kind"), "kind")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        out.append("devices: a spec needs at least one device")
        devices = []
    seen = set()
    for i, dev in enumerate(devices):
        where = f"devices[{i}]"
        if not isinstance(dev, dict):
            out.append(f"{where}: not a mapping")
            continue
        out += _fields(dev, DEVICE_FIELDS, where, version)
        name = dev.get("name")
        if not isinstance(name, str) or not DEVICE_RE.match(name):
            out.append(f"{where}.name: {name!r} is not a valid device name "
                       "(letters, digits, '_', '.', ':', '-'; alphanumeric first and last)")
        elif name in seen:
            out.append(f"{where}.name: duplicate device {name!r}")
        seen.add(name)
        edits = dev.get("containerEdits")
        if _empty_edits(edits):
            out.append(f"{where}.containerEdits: a device needs non-empty edits (CDI: \"empty device edits\")")
        if edits is not None:
            out += _edits(edits, f"{where}.containerEdits", version)
    if spec.get("containerEdits") is not None:
        out += _edits(spec["containerEdits"], "containerEdits", version)
    if version and not out:
        needed = minimum_version(spec)
        if version_key(version.removeprefix("v")) < version_key(needed):
            out.append(f"cdiVersion: the content needs {needed} or newer, the spec says {version}")
    return out


def _empty_edits(edits) -> bool:
    """CDI's rule: edits count by their entries, so ``{"env": []}`` is as empty as none."""
    if not isinstance(edits, dict):
        return edits is None
    return not any(isinstance(edits.get(k), list) and edits[k]
                   for k in ("env", "deviceNodes", "hooks", "mounts", "additionalGids", "netDevices")) \
        and edits.get("intelRdt") is None


def _strings(obj: dict, keys, where: str) -> list[str]:
    """Fields the CDI structs type as strings: any other JSON type fails the whole file."""
    return [f"{where}.{k}: {obj[k]!r} is not a string" for k in keys
            if k in obj and not isinstance(obj[k], str)]


def _fields(obj: dict, allowed: dict, where: str, version) -> list[str]:
    out = []
    for key in obj:
        if key not in allowed:
            out.append(f"{where}: unknown field {key!r}")
        elif version and version_key(version.removeprefix("v")) < version_key(allowed[key]):
            out.append(f"{where}.{key}: needs cdiVersion {allowed[key]} or newer (readers of "
                       f"{version} reject the file)")
    return out


def _edits(edits, where: str, version) -> list[str]:
    if not isinstance(edits, dict):
        return [f"{where}: not a mapping"]
    out = _fields(edits, EDITS_FIELDS, where, version)
    for key in ("env", "deviceNodes", "hooks", "mounts", "additionalGids", "netDevices"):
        if key in edits and not isinstance(edits[key], list):
            out.append(f"{where}.{key}: must be a list")
    for i, env in enumerate(edits.get("env") or []):
        if not isinstance(env, str) or env.find("=") <= 0:
            out.append(f"{where}.env[{i}]: {env!r} is not NAME=value")
    for i, node in enumerate(edits.get("deviceNodes") or []):
        w = f"{where}.deviceNodes[{i}]"
        if not isinstance(node, dict):
            out.append(f"{w}: not a mapping")
            continue
        out += _fields(node, NODE_FIELDS, w, version)
        out += _strings(node, ("path", "hostPath", "type", "permissions"), w)
        if not node.get("path"):
            out.append(f"{w}.path: required")
        if node.get("type", "") not in ("", "b", "c", "u", "p"):
            out.append(f"{w}.type: {node['type']!r} is not one of b, c, u, p")
        if not set(str(node.get("permissions", ""))) <= set("rwm"):
            out.append(f"{w}.permissions: {node['permissions']!r} is not a subset of 'rwm'")
        for num in ("major", "minor", "fileMode", "uid", "gid"):
            if num in node and (not isinstance(node[num], int) or isinstance(node[num], bool) or node[num] < 0):
                out.append(f"{w}.{num}: {node[num]!r} is not a non-negative integer")
    for i, mount in enumerate(edits.get("mounts") or []):
        w = f"{where}.mounts[{i}]"
        if not isinstance(mount, dict):
            out.append(f"{w}: not a mapping")
            continue
        out += _fields(mount, MOUNT_FIELDS, w, version)
        out += _strings(mount, ("hostPath", "containerPath", "type"), w)
        for key in ("hostPath", "containerPath"):
            if not mount.get(key):
                out.append(f"{w}.{key}: required")
        if not all(isinstance(o, str) for o in mount.get("options") or []):
            out.append(f"{w}.options: must be strings")
    for i, hook in enumerate(edits.get("hooks") or []):
        w = f"{where}.hooks[{i}]"
        if not isinstance(hook, dict):
            out.append(f"{w}: not a mapping")
            continue
        out += _fields(hook, HOOK_FIELDS, w, version)
        out += _strings(hook, ("path",), w)
        if not all(isinstance(a, str) for a in hook.get("args") or []):
            out.append(f"{w}.args: must be strings")
        if hook.get("hookName") not in HOOK_NAMES:
            out.append(f"{w}.hookName: {hook.get('hookName')!r} is not one of {', '.join(HOOK_NAMES)}")
        if not str(hook.get("path", "")).startswith("/"):
            out.append(f"{w}.path: {hook.get('path')!r} must be an absolute path")
        for j, env in enumerate(hook.get("env") or []):
            if not isinstance(env, str) or env.find("=") <= 0:
                out.append(f"{w}.env[{j}]: {env!r} is not NAME=value")
        if "timeout" in hook and (not isinstance(hook["timeout"], int) or hook["timeout"] <= 0):
            out.append(f"{w}.timeout: must be a positive integer")
    return out


def load_spec_file(path: str | os.PathLike) -> dict:
    """Parse a .json or .yaml spec as the CDI library reads it (YAML typed by YAML 1.1)."""
    return read_spec(path)[0]


def read_spec(path: str | os.PathLike) -> tuple[dict, list[str]]:
    """(document, problems of its encoding): for YAML, every unquoted scalar in a string
    field that YAML 1.1 readers turn into a number, boolean or null."""
    path = os.fspath(path)            # os.path, not pathlib: see _NameRule
    suffix = os.path.splitext(path)[1]
    if suffix not in (".json", ".yaml"):
        raise UsageError(f"{path}: CDI readers only load files ending in .json or .yaml")
    from ..fileio import read_regular
    try:
        text = read_regular(path)[0].decode("utf-8")    # never blocks on a FIFO
    except ValueError as e:                             # includes UnicodeDecodeError
        why = "is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else str(e)
        raise ConfigError(why, where=str(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot read the spec: {e.strerror}", where=str(path)) from None
    if not text.strip() or text.strip() == "---":
        raise ConfigError("no spec data", where=str(path))
    if suffix == ".json":
        from ..hooks.jsonmini import loads         # the C scanner, without import json
        try:
            return loads(text.encode()), []
        except ValueError as e:
            raise ConfigError(f"is not valid JSON: {e}", where=str(path)) from None
    import yaml
    from .yaml11 import load_go_yaml
    try:
        return load_go_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"is not valid YAML: {e}".replace("\n", " "), where=str(path)) from None
