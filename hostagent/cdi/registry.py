"""What the spec directories offer, as a container engine's CDI cache would see it."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HostagentError
from ..hostroot import HostRoot
from .validate import load_spec_file, validate_spec

__all__ = ["SPEC_DIRS", "ListedDevice", "list_devices"]

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")   # later directories take priority


@dataclass(frozen=True)
class ListedDevice:
    name: str          # fully qualified: vendor/class=name
    spec: str
    status: str        # "ok", "shadowed" (a later directory wins), "conflict" (two files, one dir)


def list_devices(host: HostRoot, dirs=SPEC_DIRS) -> tuple[list[ListedDevice], list[str]]:
    """Devices per file, and the errors of files an engine would skip."""
    errors, found = [], []          # found: (priority, file, qualified name)
    for priority, d in enumerate(dirs):
        folder = host.host(d)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix not in (".json", ".yaml") or not path.is_file():
                continue
            try:
                spec = load_spec_file(path)
            except HostagentError as e:
                errors.append(e.message)
                continue
            problems = validate_spec(spec)
            if problems:
                errors += [f"{path}: {p}" for p in problems]
                continue
            found += [(priority, str(path), f"{spec['kind']}={dev['name']}") for dev in spec["devices"]]
    out = []
    for priority, path, name in found:
        same = [(p, f) for p, f, n in found if n == name and f != path]
        if any(p == priority for p, _ in same):
            status = "conflict"
        elif any(p > priority for p, _ in same):
            status = "shadowed"
        else:
            status = "ok"
        out.append(ListedDevice(name, path, status))
    return out, errors
