"""What an OCI runtime command line and a container's config.json ask for (pure).

GPU requests are read from the first source that has any, as the NVIDIA runtime does:

1. annotations whose key starts with a configured prefix (``cdi.k8s.io/``): each value is
   a comma-separated list of fully qualified CDI names; keys are read in sorted order;
2. ``/dev/null`` bind mounts onto ``/var/run/nvidia-container-devices/<id>`` (a device
   plugin's markers), when enabled;
3. ``NVIDIA_VISIBLE_DEVICES``, for privileged containers, or for all when enabled:
   ``all``, indices, UUIDs, MIG ids like ``0:1`` or qualified names, comma-separated;
   ``none`` (driver files, no GPU); ``void`` or empty (nothing).
"""

from __future__ import annotations

from collections import namedtuple

from ..cdi.validate import CLASS_RE, DEVICE_RE, VENDOR_RE
from ..errors import UsageError

__all__ = ["RuntimeCall", "Requests", "parse_call", "gpu_requests", "is_privileged", "is_qualified", "MARKER_DIR",
           "VALUE_OPTIONS", "ENV_NAME"]

MARKER_DIR = "/var/run/nvidia-container-devices/"
ENV_NAME = "NVIDIA_VISIBLE_DEVICES"
# Global options of runc and crun that take a value (``--opt value``; ``--opt=value`` too).
VALUE_OPTIONS = {"--root", "--log", "--log-format", "--log-level", "--criu", "--rootless",
                  "--cgroup-manager"}


# Records are namedtuples, not dataclasses: this runs at every GPU container's create, and
# importing dataclasses (inspect, ast, ...) would cost about 10 ms of the shim's ~30.

# command: create, start, delete, ... (None: only global options);
# bundle: create's --bundle/-b (runc's default is the working directory), else None
RuntimeCall = namedtuple("RuntimeCall", "command bundle")


class Requests(namedtuple("Requests", "source devices driver_only_kinds", defaults=("", (), ()))):
    """source: annotations, mounts or env ("" when nothing was asked); devices: fully
    qualified CDI names; driver_only_kinds: NVIDIA_VISIBLE_DEVICES=none (spec edits only)."""
    __slots__ = ()

    def __bool__(self) -> bool:
        return bool(self.devices or self.driver_only_kinds)


def parse_call(argv: list[str]) -> RuntimeCall:
    """Find the command and, for create, the bundle in a runc-style command line."""
    i, command = 0, None
    while i < len(argv):
        arg = argv[i]
        if arg in VALUE_OPTIONS:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        command = arg
        break
    if command != "create":
        return RuntimeCall(command, None)
    bundle, rest = ".", argv[i + 1:]
    for j, arg in enumerate(rest):
        if arg == "--":
            break
        if arg in ("--bundle", "-b", "-bundle") and j + 1 < len(rest):
            bundle = rest[j + 1]
        elif arg.startswith(("--bundle=", "-bundle=", "-b=")):
            bundle = arg.split("=", 1)[1]
    return RuntimeCall(command, bundle)


def is_privileged(config: dict) -> bool:
    """Privileged as the NVIDIA runtime defines it: CAP_SYS_ADMIN in the bounding set."""
    caps = ((config.get("process") or {}).get("capabilities") or {}).get("bounding") or []
    return "CAP_SYS_ADMIN" in caps


def is_qualified(name: str) -> bool:
    """``vendor/class=device`` as CDI's parser accepts it, by ``cdi.validate``'s name rules
    (which use no re; the shim loads that module at every create anyway)."""
    kind, _, device = name.partition("=")
    vendor, _, cls = kind.partition("/")
    return bool(VENDOR_RE.match(vendor) and CLASS_RE.match(cls) and DEVICE_RE.match(device))


def _qualified(name: str, where: str) -> str:
    if not is_qualified(name):
        raise UsageError(f"{where}: {name!r} is not a fully qualified CDI device name (vendor/class=name)")
    return name


def _from_annotations(config: dict, prefixes) -> list[str]:
    annotations = config.get("annotations") or {}
    out = []
    for key in sorted(annotations):
        if any(key.startswith(p) for p in prefixes):
            out += [_qualified(v.strip(), f"annotation {key}")
                    for v in str(annotations[key]).split(",") if v.strip()]
    return out


def _from_mounts(config: dict, kind: str) -> list[str]:
    out = []
    for m in config.get("mounts") or []:
        dest = m.get("destination", "")
        if m.get("source") != "/dev/null" or not dest.startswith(MARKER_DIR):
            continue
        rest = dest[len(MARKER_DIR):].strip("/")
        if not rest or rest.startswith("imex/"):
            continue         # IMEX channels are not GPUs; not handled here
        if rest.startswith("cdi/"):
            name = rest[4:]                # vendor/class=dev or vendor/class/dev
            if "=" not in name and name.count("/") >= 2:
                vendor, cls, dev = name.split("/", 2)
                name = f"{vendor}/{cls}={dev}"
            out.append(_qualified(name, f"mount {dest}"))
        else:
            out.append(_qualified(f"{kind}={rest}", f"mount {dest}"))
    return out


def _env_value(config: dict) -> str | None:
    value = None
    for item in (config.get("process") or {}).get("env") or []:
        name, _, v = item.partition("=")
        if name == ENV_NAME:
            value = v           # the last one wins, as in a process environment
    return value


def gpu_requests(config: dict, runtime_config) -> Requests:
    """The container's GPU requests (see the module docstring for the order)."""
    names = _from_annotations(config, runtime_config.annotation_prefixes)
    if names:
        return Requests("annotations", tuple(names))
    if runtime_config.accept_volume_mounts:
        names = _from_mounts(config, runtime_config.default_kind)
        if names:
            return Requests("mounts", tuple(names))
    value = _env_value(config)
    if value is None or not (runtime_config.accept_env_unprivileged or is_privileged(config)):
        return Requests()
    value = value.strip()
    if value in ("", "void"):
        return Requests()
    if value == "none":
        return Requests("env", (), (runtime_config.default_kind,))
    kind = runtime_config.default_kind
    names = [item if "=" in item else f"{kind}={item}" for item in (v.strip() for v in value.split(",")) if item]
    return Requests("env", tuple(_qualified(n, ENV_NAME) for n in names))
