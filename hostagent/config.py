"""``/etc/hostagent/config.yaml``: one section per feature, every key optional.

The JSON Schema shipped beside this module (``config.schema.json``) and the section schemas
of other features (``SECTION_SCHEMAS``) are the single source of keys, types and defaults.
A feature adds its sections either to ``config.schema.json`` or in a schema file of its own
listed in ``SECTION_SCHEMAS`` (whose top-level ``properties`` are sections), and reads them
from ``Config.section(name)`` or a typed record. ``docs/runtime.md`` documents the
``runtime`` and ``hook`` sections.

The runtime shim loads the configuration at every GPU container's create, where importing
PyYAML and jsonschema would cost more than the rest of its work. ``load_config_cached``
therefore keeps the validated result as JSON under ``/run/hostagent`` keyed by the source
file's identity, and validates again only when the file changed.
"""

from __future__ import annotations

import os
from collections import namedtuple

from .errors import ConfigError
# JSON through the C scanner: `import json` would cost the runtime shim's create ~10 ms.
from .hooks.jsonmini import loads as _json_loads

__all__ = ["DEFAULT_PATH", "Config", "RuntimeConfig", "HookConfig", "load_config", "load_config_cached",
           "schema", "validate_data", "key_path"]

DEFAULT_PATH = "/etc/hostagent/config.yaml"
SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "config.schema.json")
# Schema files of features that keep their sections beside their code (package-relative).
SECTION_SCHEMAS = ("daemon/settings.schema.json", "health/settings.schema.json",
                   "metrics/settings.schema.json", "labels/settings.schema.json",
                   "driver/settings.schema.json", "sharing/settings.schema.json")


# Where each section's keys are documented, for the hint of a configuration error.
_SECTION_DOCS = {"runtime": "docs/runtime.md", "hook": "docs/runtime.md", "daemon": "docs/daemon.md",
                 "api": "docs/daemon.md", "mig": "docs/daemon.md", "allocations": "docs/daemon.md",
                 "labels": "docs/labels.md", "health": "docs/health.md", "metrics": "docs/metrics.md",
                 "passthrough": "docs/device-plugin.md",
                 "driver": "docs/driver.md", "sharing": "docs/sharing.md"}
_TOP_DOC = "docs/daemon.md"      # its Configuration section lists every section


# Records are namedtuples: the runtime shim reads the configuration at every GPU
# container's create, where importing dataclasses would cost ~10 ms.
RuntimeConfig = namedtuple("RuntimeConfig", "low_level_runtimes cdi_spec_dirs default_kind annotation_prefixes "
                                            "accept_volume_mounts accept_env_unprivileged log_file")
HookConfig = namedtuple("HookConfig", "interpreter in_cdi_specs")


class Config(namedtuple("Config", "data source")):
    """data: validated, every section and key present (defaults filled in); source: the
    file it came from, None when there was none."""
    __slots__ = ()

    def section(self, name: str) -> dict:
        return self.data[name]

    @property
    def runtime(self) -> RuntimeConfig:
        return RuntimeConfig(**{k: tuple(v) if isinstance(v, list) else v
                                for k, v in self.data["runtime"].items()})

    @property
    def hook(self) -> HookConfig:
        return HookConfig(**self.data["hook"])


_PACKAGE_FILES: dict[str, bytes | None] = {}


def package_file(path: str) -> bytes | None:
    """The bytes of a file shipped in the package (a schema), read once a process: they
    do not change while it runs. None when the package lacks it."""
    if path not in _PACKAGE_FILES:
        try:
            with open(path, "rb") as f:
                _PACKAGE_FILES[path] = f.read()
        except FileNotFoundError:
            _PACKAGE_FILES[path] = None
    return _PACKAGE_FILES[path]


def schema() -> dict:
    """The whole file's schema: ours plus every feature's sections."""
    out = _json_loads(package_file(SCHEMA_FILE))
    for rel in SECTION_SCHEMAS:
        raw = package_file(os.path.join(os.path.dirname(__file__), rel))
        if raw is None:
            continue                     # that feature is not installed
        extra = _json_loads(raw)
        for name, sub in extra.get("properties", {}).items():
            out["properties"].setdefault(name, sub)
    return out


def _with_defaults(data: dict, sch: dict) -> dict:
    """``data`` with every section and key present; schema defaults fill the gaps."""
    out = {}
    for section, sub in sch["properties"].items():
        given = data.get(section) or {}
        out[section] = {key: given.get(key, prop.get("default")) for key, prop in sub["properties"].items()}
    return out


def key_path(path) -> str:
    """A jsonschema error path as the dotted key path errors name: ``runtime.cdi_spec_dirs[1]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validate_data(data, source: str = "config") -> dict:
    """Validate a parsed document; return it with defaults filled in. Every problem is
    reported with its key path (``runtime.cdi_spec_dirs[1]: ...``)."""
    from .schemas import Draft7
    if data is None:
        data = {}
    sch = schema()
    validator = Draft7(sch)
    errors = list(validator.iter_errors(data))
    if errors:
        problems = []
        from .schemamsg import chosen, describe
        errors = sorted((chosen(e) for e in errors), key=lambda e: list(map(str, e.absolute_path)))
        from .textdoc import shown
        for e in errors:
            msg = describe(e)
            if e.validator == "pattern" and e.schema.get("pattern") == "^/":
                msg = f"{shown(e.instance)} must be an absolute path"
            problems.append(f"{key_path(e.absolute_path)}: {msg}")
        docs = sorted({_SECTION_DOCS.get(e.absolute_path[0] if e.absolute_path else None, _TOP_DOC)
                       for e in errors})
        raise ConfigError("; ".join(problems), where=source,
                          hint=f"see {' and '.join(docs)} for the keys and their defaults")
    return _with_defaults(data, sch)


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read, validate and complete the configuration; a missing file means all defaults."""
    from .fileio import read_regular
    path = os.fspath(path or DEFAULT_PATH)
    try:
        text = read_regular(path)[0]          # a FIFO or device never blocks the read
    except FileNotFoundError:
        return Config(_with_defaults({}, schema()), None)
    except ValueError as e:
        raise ConfigError(f"{e}", where=path, hint="the configuration must be a regular file") from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", where=path) from None
    from .textdoc import decode
    data = decode(text, path, "hostagent configuration")
    try:
        return Config(validate_data(data, path), path)
    except RecursionError:
        raise ConfigError("is nested too deeply to be a hostagent configuration", where=path) from None


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def load_config_cached(path: str | os.PathLike | None, cache_dir: str | os.PathLike) -> Config:
    """``load_config`` for hot paths: reuse the validated copy in ``cache_dir`` while the
    source file is unchanged (same device, inode, size, mtime and ctime)."""
    path = os.fspath(path or DEFAULT_PATH)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Config(_with_defaults({}, schema()), None)
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", where=path) from None
    cache = os.path.join(os.fspath(cache_dir), "config." + path.replace("/", "_") + ".json")
    try:
        with open(cache, "rb") as f:
            cached = _json_loads(f.read())
        if cached.get("stamp") == _stamp(st) and cached.get("source") == path:
            return Config(cached["data"], path)
    except (OSError, ValueError, AttributeError):
        pass
    config = load_config(path)
    try:
        import json
        from .fileio import ensure_dir, write_atomic
        ensure_dir(cache_dir)
        write_atomic(cache, json.dumps({"source": path, "stamp": _stamp(st), "data": config.data}), mode=0o600)
    except OSError:
        pass    # a cache we cannot write only costs time
    return config
