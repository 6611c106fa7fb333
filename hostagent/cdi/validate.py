"""CDI spec validation: the CDI library's rules (strict fields, names, versions, edits)
with a precise location for every problem.
"""

from __future__ import annotations

import os

from ..errors import ConfigError, UsageError
from .version import KNOWN_VERSIONS, minimum_version, version_key

__all__ = ["check_kind", "validate_spec", "spec_warnings", "spec_version", "load_spec_file", "read_spec",
           "VENDOR_RE", "CLASS_RE", "DEVICE_RE"]



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
EDIT_LISTS = ("env", "deviceNodes", "hooks", "mounts", "additionalGids", "netDevices")
# enableCMT/enableMBM (0.7.0 to 1.0.0) are gone from the 1.1.0 library: unknown fields there.
RDT_FIELDS = {"closID": "0.7.0", "l3CacheSchema": "0.7.0", "memBwSchema": "0.7.0", "schemata": "1.1.0",
              "enableMonitoring": "1.1.0"}
NET_FIELDS = {"hostInterfaceName": "1.1.0", "name": "1.1.0"}
NODE_FIELDS = {"path": "0.3.0", "type": "0.3.0", "major": "0.3.0", "minor": "0.3.0", "fileMode": "0.3.0",
               "permissions": "0.3.0", "uid": "0.3.0", "gid": "0.3.0", "hostPath": "0.5.0"}
MOUNT_FIELDS = {"hostPath": "0.3.0", "containerPath": "0.3.0", "options": "0.3.0", "type": "0.4.0"}
HOOK_FIELDS = {"hookName": "0.3.0", "path": "0.3.0", "args": "0.3.0", "env": "0.3.0", "timeout": "0.3.0"}
UINT32 = (1 << 32) - 1
# Go types: major/minor int64 (negative numbers refused here: no device has them),
# uid/gid *uint32, fileMode *os.FileMode (uint32).
NODE_NUMBERS = {"major": (0, (1 << 63) - 1), "minor": (0, (1 << 63) - 1), "fileMode": (0, UINT32),
                "uid": (0, UINT32), "gid": (0, UINT32)}


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


def spec_version(spec) -> str | None:
    """The spec's cdiVersion without its optional leading ``v``, if it is a known one."""
    version = spec.get("cdiVersion") if isinstance(spec, dict) else None
    if isinstance(version, str) and version.removeprefix("v") in KNOWN_VERSIONS:
        return version.removeprefix("v")
    return None


def spec_warnings(spec) -> list[str]:
    """What the newest CDI library accepts but older readers refuse."""
    version = spec.get("cdiVersion") if isinstance(spec, dict) else None
    if spec_version(spec) and version.startswith("v"):
        return [f"cdiVersion: {version!r} has a leading 'v': CDI libraries before 0.5.4 (podman 4.3.1's) "
                "reject the file"]
    return []


def validate_spec(spec) -> list[str]:
    """Every problem in ``spec`` (a parsed document), each prefixed with where it is. Any
    document at all gives a list, never an exception: third-party files are checked with
    this before anything trusts their shape."""
    if not isinstance(spec, dict):
        return ["the spec is not a mapping"]
    out: list[str] = []
    version = spec_version(spec)
    if version is None:
        out.append(f"cdiVersion: {spec.get('cdiVersion')!r} is not a known CDI version ({', '.join(KNOWN_VERSIONS)})")
    out += _fields(spec, SPEC_FIELDS, "spec", version)
    out += _kind_problems(spec.get("kind"), "kind")
    out += _annotations(spec, "annotations")
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
        out += _annotations(dev, f"{where}.annotations")
        name = dev.get("name")
        if not isinstance(name, str) or not DEVICE_RE.match(name):
            out.append(f"{where}.name: {name!r} is not a valid device name "
                       "(letters, digits, '_', '.', ':', '-'; alphanumeric first and last)")
        elif name in seen:
            out.append(f"{where}.name: duplicate device {name!r}")
        else:
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
        if version_key(version) < version_key(needed):
            out.append(f"cdiVersion: the content needs {needed} or newer, the spec says {spec['cdiVersion']}")
    return out


def _empty_edits(edits) -> bool:
    """CDI's rule: edits count by their entries, so ``{"env": []}`` is as empty as none."""
    if not isinstance(edits, dict):
        return edits is None
    return not any(isinstance(edits.get(k), list) and edits[k] for k in EDIT_LISTS) \
        and edits.get("intelRdt") is None


def _strings(obj: dict, keys, where: str) -> list[str]:
    """Fields the CDI structs type as strings: any other JSON type fails the whole file."""
    return [f"{where}.{k}: {obj[k]!r} is not a string" for k in keys
            if k in obj and obj[k] is not None and not isinstance(obj[k], str)]


def _integers(obj: dict, bounds: dict, where: str) -> list[str]:
    """Integer fields within their Go type's range (``bounds``: name -> (low, high))."""
    out = []
    for key, (low, high) in bounds.items():
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            out.append(f"{where}.{key}: {value!r} is not an integer from {low} to {high}")
    return out


def _string_list(value, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return [f"{where}: must be a list of strings"]
    return []


def _env(value, where: str) -> list[str]:
    out = _string_list(value, where)
    if out:
        return out
    return [f"{where}[{i}]: {env!r} is not NAME=value" for i, env in enumerate(value or [])
            if env.find("=") <= 0]


def _annotations(obj: dict, where: str) -> list[str]:
    """A map of strings to strings, as the Go struct decodes it (the library's key rules
    are never applied: see docs/cdi.md)."""
    value = obj.get("annotations")
    if value is None:
        return []
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return [f"{where}: must map strings to strings"]
    return []


def _fields(obj: dict, allowed: dict, where: str, version) -> list[str]:
    out = []
    for key in obj:
        if key not in allowed:
            out.append(f"{where}: unknown field {key!r}")
        elif version and version_key(version) < version_key(allowed[key]):
            out.append(f"{where}.{key}: needs cdiVersion {allowed[key]} or newer (readers of "
                       f"{version} reject the file)")
    return out


def _objects(edits: dict, key: str, where: str):
    """(place, mapping) for each entry of list ``key``; problems for entries that are not."""
    for i, item in enumerate(edits.get(key) or []):
        yield f"{where}.{key}[{i}]", item


def _edits(edits, where: str, version) -> list[str]:
    if not isinstance(edits, dict):
        return [f"{where}: not a mapping"]
    out = _fields(edits, EDITS_FIELDS, where, version)
    bad_lists = [k for k in EDIT_LISTS if edits.get(k) is not None and not isinstance(edits[k], list)]
    out += [f"{where}.{k}: must be a list" for k in bad_lists]
    edits = {k: v for k, v in edits.items() if k not in bad_lists}
    out += _env(edits.get("env"), f"{where}.env")
    for w, node in _objects(edits, "deviceNodes", where):
        if not isinstance(node, dict):
            out.append(f"{w}: not a mapping")
            continue
        out += _fields(node, NODE_FIELDS, w, version)
        out += _strings(node, ("path", "hostPath", "type", "permissions"), w)
        if not node.get("path"):
            out.append(f"{w}.path: required")
        if node.get("type") not in (None, "", "b", "c", "u", "p"):
            out.append(f"{w}.type: {node['type']!r} is not one of b, c, u, p")
        if isinstance(node.get("permissions"), str) and not set(node["permissions"]) <= set("rwm"):
            out.append(f"{w}.permissions: {node['permissions']!r} is not a subset of 'rwm'")
        out += _integers(node, NODE_NUMBERS, w)
    for w, mount in _objects(edits, "mounts", where):
        if not isinstance(mount, dict):
            out.append(f"{w}: not a mapping")
            continue
        out += _fields(mount, MOUNT_FIELDS, w, version)
        out += _strings(mount, ("hostPath", "containerPath", "type"), w)
        for key in ("hostPath", "containerPath"):
            if not mount.get(key):
                out.append(f"{w}.{key}: required")
        out += _string_list(mount.get("options"), f"{w}.options")
    for w, hook in _objects(edits, "hooks", where):
        if not isinstance(hook, dict):
            out.append(f"{w}: not a mapping")
            continue
        out += _fields(hook, HOOK_FIELDS, w, version)
        out += _strings(hook, ("hookName", "path"), w)
        out += _string_list(hook.get("args"), f"{w}.args")
        if hook.get("hookName") not in HOOK_NAMES:
            out.append(f"{w}.hookName: {hook.get('hookName')!r} is not one of {', '.join(HOOK_NAMES)}")
        if not isinstance(hook.get("path"), str) or not hook["path"].startswith("/"):
            out.append(f"{w}.path: {hook.get('path')!r} must be an absolute path")
        out += _env(hook.get("env"), f"{w}.env")
        timeout = hook.get("timeout")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0):
            out.append(f"{w}.timeout: must be a positive integer")
    for i, gid in enumerate(edits.get("additionalGids") or []):
        if not isinstance(gid, int) or isinstance(gid, bool) or not 0 <= gid <= UINT32:
            out.append(f"{where}.additionalGids[{i}]: {gid!r} is not a group id (0 to {UINT32})")
    if edits.get("intelRdt") is not None:
        out += _intel_rdt(edits["intelRdt"], f"{where}.intelRdt", version)
    out += _net_devices(edits.get("netDevices") or [], f"{where}.netDevices", version)
    return out


def _intel_rdt(rdt, where: str, version) -> list[str]:
    if not isinstance(rdt, dict):
        return [f"{where}: not a mapping"]
    out = _fields(rdt, RDT_FIELDS, where, version)
    out += _strings(rdt, ("closID", "l3CacheSchema", "memBwSchema"), where)
    out += _string_list(rdt.get("schemata"), f"{where}.schemata")
    if rdt.get("enableMonitoring") is not None and not isinstance(rdt["enableMonitoring"], bool):
        out.append(f"{where}.enableMonitoring: must be true or false")
    clos = rdt.get("closID")
    # A resctrl group is a directory: "/" (the root group) or a usable file name.
    if isinstance(clos, str) and clos not in ("", "/") and (
            clos in (".", "..") or "/" in clos or "\n" in clos or len(clos) >= 4096):
        out.append(f"{where}.closID: {clos!r} is not '/' or a usable directory name "
                   "(not '.' or '..', no '/' or newline, under 4096 characters)")
    return out


def _net_devices(devices: list, where: str, version) -> list[str]:
    out, hosts, names = [], set(), set()
    for i, dev in enumerate(devices):
        w = f"{where}[{i}]"
        if not isinstance(dev, dict):
            out.append(f"{w}: not a mapping")
            continue
        out += _fields(dev, NET_FIELDS, w, version)
        out += _strings(dev, NET_FIELDS, w)
        for key, seen in (("hostInterfaceName", hosts), ("name", names)):
            value = dev.get(key)
            if not value:
                out.append(f"{w}.{key}: required (a network device needs a non-empty {key})")
            elif isinstance(value, str):
                if value in seen:
                    out.append(f"{w}.{key}: duplicate {value!r}")
                seen.add(value)
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
        raise UsageError("CDI readers only load files ending in .json or .yaml", where=path)
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
            from ..docerrors import syntax_error
            raise syntax_error(e, str(path), "JSON") from None
        except RecursionError:
            raise ConfigError("is nested too deeply to be a CDI spec", where=str(path)) from None
    from .yaml11 import load_go_yaml
    return load_go_yaml(text, str(path))
