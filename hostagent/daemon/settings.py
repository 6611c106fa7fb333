"""The daemon's view of ``/etc/hostagent/config.yaml``: its ``daemon`` and ``api`` sections
as typed records, validated against JSON Schema, every key optional.

The shared configuration module (``hostagent.config``) owns the file and its schema; the
daemon's sections live in that schema. Until that module exists the daemon validates its
own sections with ``settings.schema.json`` and leaves other sections to their owners.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..hostroot import HostRoot

__all__ = ["Settings", "DaemonSettings", "ApiSettings", "load_settings", "SECTIONS"]

SECTIONS = ("daemon", "api")
_SCHEMA = Path(__file__).with_name("settings.schema.json")


@dataclass(frozen=True)
class DaemonSettings:
    log_level: str = "info"
    resync_interval: float = 60
    shutdown_grace: float = 5


@dataclass(frozen=True)
class ApiSettings:
    socket: str = "/run/hostagent/hostagent.sock"
    group: str = "hostagent"
    socket_mode: str = "0660"
    max_connections: int = 512
    max_connections_per_user: int = 128
    max_header_bytes: int = 16384
    max_body_bytes: int = 262144
    header_timeout: float = 10
    body_timeout: float = 10
    idle_timeout: float = 60
    write_timeout: float = 30
    watch_buffer: int = 4096
    watch_heartbeat: float = 30

    @property
    def mode(self) -> int:
        return int(self.socket_mode, 8)

    # Keys that only take effect when the socket is made.
    RESTART_KEYS = ("socket", "group", "socket_mode")


@dataclass(frozen=True)
class Settings:
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    sections: dict = field(default_factory=dict, compare=False)   # every section, as validated
    source: str | None = None

    def restart_needed(self, new: "Settings") -> list[str]:
        return [f"api.{k}" for k in ApiSettings.RESTART_KEYS
                if getattr(self.api, k) != getattr(new.api, k)]


def _own_schema() -> dict:
    with open(_SCHEMA) as f:
        return json.load(f)


def _shared_config():
    """``hostagent.config`` if it exists and its schema has the daemon's sections."""
    try:
        from .. import config
    except ImportError:
        return None
    props = config.schema().get("properties", {})
    return config if all(s in props for s in SECTIONS) else None


def _read_yaml(path: str):
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", where=path) from None
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"is not valid YAML: {e}".replace("\n", " "), where=path) from None


def _validate_own(data, path: str) -> dict:
    import jsonschema
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", where=path)
    schema = _own_schema()
    mine = {k: v for k, v in data.items() if k in SECTIONS}
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(mine),
                    key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        problems = [f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: "
                    f"{e.message.replace('Additional properties are not allowed', 'unknown key(s)')}"
                    for e in errors]
        raise ConfigError("; ".join(problems), where=path, hint="see docs/daemon.md for the keys")
    out = dict(data)
    for section, sub in schema["properties"].items():
        given = data.get(section) or {}
        out[section] = {k: given.get(k, p.get("default")) for k, p in sub["properties"].items()}
    return out


def load_settings(host: HostRoot, path: str | os.PathLike | None = None) -> Settings:
    """Read and validate the configuration; a missing file means every default."""
    path = os.fspath(path or host.config_file)
    shared = _shared_config()
    if shared is not None:
        config = shared.load_config(path)
        sections, source = config.data, config.source
    else:
        data = _read_yaml(path)
        sections, source = _validate_own(data, path), (path if data is not None else None)
    return Settings(daemon=DaemonSettings(**sections["daemon"]), api=ApiSettings(**sections["api"]),
                    sections=sections, source=source)
