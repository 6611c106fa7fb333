"""The sharing configuration: the NVIDIA device plugin's config file, accepted unchanged.

``version: v1``, ``flags.migStrategy``, ``sharing.timeSlicing`` / ``sharing.mps`` with
``renameByDefault``, ``failRequestsGreaterThanOne`` and ``resources[].name/rename/devices/
replicas``, with the device plugin's defaults (``devices: all``; ``failRequestsGreaterThanOne``
true for MPS, false for time-slicing; ``renameByDefault`` renames to ``<name>.shared``) and
its errors. On top, hostagent's own per-resource settings: ``replicas: 1``, ``interval``
(time-slicing), ``activeThreadPercentage`` and ``pinnedMemoryLimit`` (MPS); the device plugin
ignores keys it does not know, so one file serves both. Where the device plugin ignores
``rename`` and ``devices`` ("not yet supported"), hostagent honours them.

Validated with ``config.schema.json`` beside this module; checks that need the node's
devices are the planner's (``resolve``). The configuration in force is kept in
``/etc/hostagent/sharing.yaml`` so a restart restores it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import ConfigError
from ..hostroot import HostRoot
from ..textdoc import shown

__all__ = ["ResourceSpec", "StrategySpec", "SharingConfig", "EMPTY", "INTERVALS", "parse", "load_text",
           "load_file", "config_path", "load_persisted", "render", "resource_name", "quantity_mib", "DOC"]

SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "config.schema.json")
DOC = "docs/sharing.md"
PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"            # the device plugin's DefaultSharedResourceNameSuffix
MAX_NAME = 63                        # the device plugin's MaxResourceNameLength
# nvidia-smi compute-policy --set-timeslice 0..3, the DRA driver's TimeSliceInterval.Int().
INTERVALS = ("Default", "Short", "Medium", "Long")
# The file's keys, hostagent's record names.
STRATEGY_KEYS = (("mps", "mps"), ("timeSlicing", "time-slicing"))
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")   # fullmatch
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@dataclass(frozen=True)
class ResourceSpec:
    """One entry of ``sharing.<strategy>.resources``."""
    name: str                                  # nvidia.com/gpu, nvidia.com/mig-1g.5gb
    rename: str | None
    devices: str | int | tuple[str, ...]       # "all", the first N, or device references
    replicas: int
    where: str                                 # sharing.mps.resources[0], for errors
    interval: str | None = None                # time-slicing
    active_thread_percentage: int | None = None     # MPS
    pinned_memory_limit_mib: int | None = None       # MPS


@dataclass(frozen=True)
class StrategySpec:
    strategy: str                              # "mps" or "time-slicing"
    key: str                                   # "mps" or "timeSlicing", as in the file
    rename_by_default: bool
    fail_requests_greater_than_one: bool
    resources: tuple[ResourceSpec, ...]


@dataclass(frozen=True)
class SharingConfig:
    document: dict                             # the file as validated (JSON values)
    mig_strategy: str | None                   # flags.migStrategy: how MIG devices are named (None: unset)
    strategies: tuple[StrategySpec, ...]
    source: str | None = None                  # where it came from
    warnings: tuple[str, ...] = ()             # keys ignored, as the device plugin ignores them

    @property
    def empty(self) -> bool:
        return not self.strategies


EMPTY = SharingConfig({}, None, ())


def _schema() -> dict:
    import json
    from ..config import package_file
    return json.loads(package_file(SCHEMA_FILE))


def _problem(e, schema: dict) -> str:
    from ..schemas import Draft7
    from ..config import key_path
    from ..schemamsg import describe
    where = key_path(e.absolute_path)
    if e.absolute_path and e.absolute_path[-1] == "devices":
        if isinstance(e.instance, list) and e.instance:
            item = Draft7(schema["definitions"]["devices"]["oneOf"][2]["items"])
            bad = [(i, v) for i, v in enumerate(e.instance) if not item.is_valid(v)]
            if bad:
                more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
                return "; ".join(f"{where}[{i}]: {shown(v)} is not a GPU index, a MIG name (0:1) or a UUID"
                                 for i, v in bad[:3]) + more
        return (f"{where}: {shown(e.instance)} is not a device list: 'all', a count, or GPU indices, "
                f"MIG names (0:1) and UUIDs")
    if e.validator == "enum" and e.absolute_path and e.absolute_path[-1] == "version":
        return f"{where}: unknown version {shown(e.instance)} (the device plugin's config has version v1)"
    return f"{where}: {describe(e)}"


def resource_name(raw: str, where: str, source: str | None) -> str:
    """The device plugin's NewResourceName: ``nvidia.com/`` prefixed when missing, at most 63
    characters, the name part a DNS subdomain."""
    name = raw if raw.startswith(PREFIX + "/") else f"{PREFIX}/{raw}"
    if len(name) > MAX_NAME:
        raise _error(f"{where}: resource name {shown(name)} is longer than {MAX_NAME} characters", source)
    if not _DNS_SUBDOMAIN.fullmatch(name.split("/", 1)[1]):
        raise _error(f"{where}: incorrect format for resource name {name!r} (lower-case letters, "
                     f"digits, '-' and '.')", source)
    return name


def quantity_mib(quantity: str) -> int:
    """A Kubernetes quantity of bytes (``10Gi``, ``1024M``, ``1073741824``) in whole MiB."""
    number, unit = re.fullmatch(r"([0-9]+)([A-Za-z]*)", quantity).groups()
    return int(number) * _UNITS[unit] // 2**20


def _mib(quantity: str, where: str, source: str | None) -> int:
    mib = quantity_mib(quantity)
    if mib < 1:
        raise _error(f"{where}: {quantity!r} is below 1 MiB", source)
    return mib


def _error(what: str, source: str | None) -> ConfigError:
    return ConfigError(what, where=source, hint=f"see {DOC} for the sharing configuration")


def parse(data, source: str | None = None) -> SharingConfig:
    """Validate a parsed document and build its records; every schema problem is named with
    its key path in one error. A key the schema does not know is a warning: the device
    plugin ignores it, so a file written for a newer plugin still serves here."""
    from ..schemas import Draft7
    from ..textdoc import normalise
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _error(f"the sharing configuration must be a mapping, not {type(data).__name__}", source)
    try:
        data = normalise(data)               # 2.0 is 2, as the device plugin reads it
    except ConfigError as e:
        raise _error(f"the sharing configuration {e.what}", source) from None
    schema = _schema()
    found = sorted(Draft7(schema).iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    unknown = [e for e in found if e.validator == "additionalProperties"]
    errors = [e for e in found if e.validator != "additionalProperties"]
    if errors:
        raise _error("; ".join(dict.fromkeys(_problem(e, schema) for e in errors)), source)
    warnings = tuple(dict.fromkeys(f"{_problem(e, schema)}, ignored (as the device plugin ignores it)"
                                   for e in unknown))
    strategies = []
    for key, strategy in STRATEGY_KEYS:
        section = (data.get("sharing") or {}).get(key)
        if section is None:
            continue
        rename_by_default = section.get("renameByDefault", False)
        resources = []
        for i, r in enumerate(section["resources"]):
            where = f"sharing.{key}.resources[{i}]"
            name = resource_name(r["name"], f"{where}.name", source)
            rename = r.get("rename")
            rename = resource_name(rename, f"{where}.rename", source) if rename else None
            if rename is None and rename_by_default:
                rename = name + SHARED_SUFFIX
            devices = r.get("devices", "all")
            if isinstance(devices, list):
                devices = tuple(str(d) for d in devices)
            limit = r.get("pinnedMemoryLimit")
            resources.append(ResourceSpec(
                name=name, rename=rename, devices=devices, replicas=r["replicas"], where=where,
                interval=r.get("interval"), active_thread_percentage=r.get("activeThreadPercentage"),
                pinned_memory_limit_mib=_mib(limit, f"{where}.pinnedMemoryLimit", source) if limit else None))
        # The device plugin's NewConfig keeps MPS's historical default (true) unless the file
        # says otherwise; time-slicing's default is false.
        fail = section.get("failRequestsGreaterThanOne", strategy == "mps")
        strategies.append(StrategySpec(strategy, key, rename_by_default, fail, tuple(resources)))
    mig_strategy = (data.get("flags") or {}).get("migStrategy")
    return SharingConfig(data, mig_strategy, tuple(strategies), source, warnings)


def load_text(text: str | bytes, source: str | None = None) -> SharingConfig:
    """A sharing file's text, YAML or JSON."""
    from ..textdoc import decode
    return parse(decode(text, source or "<text>", "sharing configuration"), source)


def load_file(path: str) -> SharingConfig:
    """A sharing file (a regular file of bounded size); ``-`` reads standard input."""
    from ..fileio import read_config_file
    return load_text(read_config_file(path, "sharing configuration"), "<stdin>" if path == "-" else path)


def config_path(host: HostRoot):
    return host.host("/etc/hostagent/sharing.yaml")


def load_persisted(host: HostRoot) -> SharingConfig:
    """The configuration in force; EMPTY when none was applied."""
    from ..fileio import read_config_file
    path = config_path(host)
    if not path.exists():
        return EMPTY
    return load_text(read_config_file(str(path), "sharing configuration"), str(path))


def render(config: SharingConfig) -> str:
    """The text persisted for ``config``: its document, with a line saying how it got there."""
    import yaml
    return ("# Applied with 'hostagent sharing apply' (or PUT /v1/sharing); 'hostagent sharing off'\n"
            "# removes it. The daemon restores it at start.\n"
            + yaml.safe_dump(config.document, sort_keys=False, default_flow_style=False))
