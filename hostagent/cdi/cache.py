"""The devices a set of spec directories offers, resolved as CDI's cache resolves them.

Only regular ``.json``/``.yaml`` files directly in a directory count; a file that fails to
parse or validate is skipped and reported; a later directory wins over an earlier one; the
same device in two files of one directory is a conflict and is offered by neither.
"""

from __future__ import annotations

import os
from collections import namedtuple

from ..errors import HostagentError
from .validate import load_spec_file, validate_spec

__all__ = ["SpecDevice", "Cache", "load_cache"]


# namedtuples rather than dataclasses: the runtime shim loads this at every GPU container's
# create, and the dataclasses import alone costs ~10 ms there.

# name: fully qualified (vendor/class=name); path: the spec file; spec: the whole spec (its
# top-level containerEdits apply once per spec); edits: the device's containerEdits
SpecDevice = namedtuple("SpecDevice", "name path spec edits")


class Cache(namedtuple("Cache", "devices specs errors")):
    """devices: name -> SpecDevice; specs: (file, spec), highest priority first; errors:
    the files an engine would skip, and why."""
    __slots__ = ()

    def spec_for_kind(self, kind: str) -> tuple[str, dict] | None:
        """The highest-priority valid spec of ``kind`` (for requests of no device, only the
        driver files: NVIDIA_VISIBLE_DEVICES=none)."""
        return next(((p, s) for p, s in self.specs if s.get("kind") == kind), None)


def _spec_files(folder: str) -> list[str]:
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise HostagentError(f"cannot list CDI spec directory: {e.strerror}", where=folder) from None
    out = []
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith((".json", ".yaml")) and os.path.isfile(path):
            out.append(path)
    return out


def load_cache(dirs) -> Cache:
    """Load every spec in ``dirs`` (lowest priority first; real filesystem paths)."""
    errors: list[str] = []
    by_priority: list[dict[str, SpecDevice]] = []
    specs: list[tuple[str, dict]] = []
    for folder in dirs:
        found: dict[str, SpecDevice] = {}
        conflicts: set[str] = set()
        for path in _spec_files(os.fspath(folder)):
            try:
                spec = load_spec_file(path)
                problems = validate_spec(spec)
            except HostagentError as e:
                errors.append(e.message)
                continue
            except Exception as e:            # noqa: BLE001 - a file must never break the others
                # Files in these folders come from anyone: whatever one holds, it is skipped
                # with a warning, as the engines' caches skip it; it never fails the rest.
                errors.append(f"{path}: cannot be read as a CDI spec ({type(e).__name__}: {e}); skipped")
                continue
            if problems:
                errors += [f"{path}: {p}" for p in problems]
                continue
            specs.append((path, spec))
            for dev in spec["devices"]:
                name = f"{spec['kind']}={dev['name']}"
                if name in found:
                    conflicts.add(name)
                    errors.append(f"{path}: device {name} conflicts with {found[name].path}")
                    continue
                found[name] = SpecDevice(name, path, spec, dev["containerEdits"])
        for name in conflicts:
            del found[name]
        by_priority.append(found)
    devices: dict[str, SpecDevice] = {}
    for found in by_priority:          # later directories overwrite earlier ones
        devices.update(found)
    return Cache(devices=devices, specs=tuple(reversed(specs)), errors=tuple(errors))
