"""The daemon's view of ``/etc/hostagent/config.yaml``: its ``daemon``, ``api``, ``mig`` and
``allocations`` sections as typed records. The shared configuration module
(``hostagent.config``) reads and validates the whole file; the daemon's sections are defined
in ``settings.schema.json`` beside this module, which that module joins into the file's
schema.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..hostroot import HostRoot

__all__ = ["Settings", "DaemonSettings", "ApiSettings", "MigSettings", "AllocationSettings", "load_settings",
           "SECTIONS"]

SECTIONS = ("daemon", "api", "mig", "allocations")


@dataclass(frozen=True)
class DaemonSettings:
    log_level: str = "info"
    resync_interval: float = 60
    shutdown_grace: float = 5
    work_timeout: float = 120


@dataclass(frozen=True)
class ApiSettings:
    socket: str = "/run/hostagent/hostagent.sock"
    group: str = "hostagent"
    socket_mode: str = "0660"
    max_connections: int = 512
    max_connections_per_user: int = 128
    root_reserved_connections: int = 32
    max_header_bytes: int = 16384
    max_body_bytes: int = 262144
    header_timeout: float = 10
    body_timeout: float = 10
    idle_timeout: float = 60
    write_timeout: float = 30
    watch_buffer: int = 4096
    watch_heartbeat: float = 30
    plugin_uids: tuple[int, ...] = ()       # besides root, may make MIG devices for claims

    def __post_init__(self):
        object.__setattr__(self, "plugin_uids", tuple(self.plugin_uids))

    @property
    def mode(self) -> int:
        return int(self.socket_mode, 8)

    # Keys that only take effect when the socket is made.
    RESTART_KEYS = ("socket", "group", "socket_mode")


@dataclass(frozen=True)
class MigSettings:
    config: str | None = None
    config_file: str | None = None


@dataclass(frozen=True)
class AllocationSettings:
    max_per_device: int = 32
    max_total: int = 1024
    max_per_caller: int = 128               # a uid's allocations (not root's, not api.plugin_uids')
    max_bytes_per_caller: int = 1 << 20     # their checkpoint entries' bytes


@dataclass(frozen=True)
class Settings:
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    mig: MigSettings = field(default_factory=MigSettings)
    allocations: AllocationSettings = field(default_factory=AllocationSettings)
    sections: dict = field(default_factory=dict, compare=False)   # every section, as validated
    source: str | None = None

    def restart_needed(self, new: "Settings") -> list[str]:
        return [f"api.{k}" for k in ApiSettings.RESTART_KEYS
                if getattr(self.api, k) != getattr(new.api, k)]


def load_settings(host: HostRoot, path: str | os.PathLike | None = None) -> Settings:
    """Read and validate the configuration; a missing file means every default. A setting
    this node may not have (``hook.in_cdi_specs: false`` on a real node) is refused."""
    from ..cdi.hookhome import hook_in_specs
    from ..config import load_config
    config = load_config(os.fspath(path or host.config_file))
    hook_in_specs(host, config.section("hook"), config.source)
    return Settings(daemon=DaemonSettings(**config.section("daemon")),
                    api=ApiSettings(**config.section("api")), mig=MigSettings(**config.section("mig")),
                    allocations=AllocationSettings(**config.section("allocations")),
                    sections=config.data,
                    source=config.source)
