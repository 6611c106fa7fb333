"""mig-parted v1 config files: read unchanged, validated while parsing.

The checks and their wording follow mig-parted's ``api/spec/v1/spec.go`` and
``pkg/types/mig_config.go`` (see docs/mig.md); each message is prefixed with where in the
file it applies. One deliberate addition: a ``device-filter`` that is not a PCI id is an
error here, where mig-parted silently never matches it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, NotFoundError, UnknownName
from ..textdoc import cut, shown
from .profiles import parse_profile

__all__ = ["DeviceFilter", "ConfigEntry", "MigSpec", "parse_spec", "load_spec", "VERSION", "ConfigNotSelected",
           "decode_document"]

VERSION = "v1"
_ENTRY_FIELDS = ("device-filter", "devices", "mig-enabled", "mig-devices")


class ConfigNotSelected(ConfigError):
    code = "config_not_selected"


@dataclass(frozen=True)
class DeviceFilter:
    """``0xDDDDVVVV`` (device, vendor), optionally ``:0xSSSSVVVV`` (subsystem) since v0.15."""
    device: int
    subsystem: int | None = None

    @classmethod
    def parse(cls, text: str) -> "DeviceFilter":
        head, colon, tail = text.partition(":")
        try:
            device = int(head.strip(), 0)
            subsystem = int(tail.strip(), 0) if colon else None
        except ValueError:
            raise ValueError(f"invalid device-filter '{cut(text)}' (expected a PCI id such as "
                             "'0x20B010DE' or '0x20B010DE:0x134F10DE')") from None
        for value in (device, subsystem):
            if value is not None and not 0 <= value < 1 << 32:
                raise ValueError(f"invalid device-filter '{cut(text)}' (out of range)")
        return cls(device, subsystem)

    def matches(self, device_id: int, subsystem_id: int) -> bool:
        return device_id == self.device and self.subsystem in (None, subsystem_id)

    def __str__(self) -> str:
        text = f"0x{self.device:08X}"
        return text if self.subsystem is None else f"{text}:0x{self.subsystem:08X}"


@dataclass(frozen=True)
class ConfigEntry:
    """One ``MigConfigSpec``: which GPUs, and the mode and devices they get."""
    devices: str | tuple[int, ...]              # "all", or NVML indices
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...] = ()   # profile name -> count, as written
    device_filter: tuple[DeviceFilter, ...] = ()

    def selects(self, index: int, device_id: int, subsystem_id: int = 0) -> bool:
        if self.device_filter and not any(f.matches(device_id, subsystem_id) for f in self.device_filter):
            return False
        return self.devices == "all" or index in self.devices

    def to_dict(self) -> dict:
        out: dict = {}
        if self.device_filter:
            filters = [str(f) for f in self.device_filter]
            out["device-filter"] = filters[0] if len(filters) == 1 else filters
        out["devices"] = self.devices if self.devices == "all" else list(self.devices)
        out["mig-enabled"] = self.mig_enabled
        if self.mig_enabled:
            out["mig-devices"] = dict(self.mig_devices)
        return out


@dataclass(frozen=True)
class MigSpec:
    configs: dict[str, tuple[ConfigEntry, ...]]
    source: str = "<bundled default>"

    def select(self, name: str | None) -> tuple[str, tuple[ConfigEntry, ...]]:
        """The named config; without a name, the only one (as mig-parted allows)."""
        if not self.configs:
            raise NotFoundError("the file has no MIG configs", where=self.source,
                                hint="add one under 'mig-configs'")
        if name is None:
            if len(self.configs) != 1:
                # mig-parted's words and exit status (1, not a usage error: the file decides)
                raise ConfigNotSelected("missing required flag 'selected-config' when more than one "
                                        f"config available ({len(self.configs)} configs)", where=self.source,
                                        hint="choose one with -c: " + ", ".join(sorted(self.configs)))
            name = next(iter(self.configs))
        if name not in self.configs:
            raise UnknownName(f"no MIG config named '{cut(name)}'", name=cut(name), where=self.source,
                                hint="configs: " + ", ".join(sorted(self.configs)))
        return name, self.configs[name]

    def to_dict(self) -> dict:
        return {"version": VERSION,
                "mig-configs": {k: [e.to_dict() for e in v] for k, v in self.configs.items()}}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry(raw, where: str) -> ConfigEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, not {type(raw).__name__}")
    for field in ("devices", "mig-enabled"):
        if field not in raw:
            raise ValueError(f"{where}: missing required field: {field}")
    for key in raw:
        if key not in _ENTRY_FIELDS:
            raise ValueError(f"{where}: unexpected field: {cut(str(key))}")

    filters = raw.get("device-filter")
    if filters is None or filters == "":
        filters = []
    elif isinstance(filters, str):
        filters = [filters]
    elif not (isinstance(filters, list) and all(isinstance(f, str) for f in filters)):
        raise ValueError(f"{where}: 'device-filter' must be a string or a list of strings "
                         "(quote hex ids in YAML: \"0x20B010DE\")")
    try:
        device_filter = tuple(DeviceFilter.parse(f) for f in filters)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None

    devices = raw["devices"]
    if devices is None or isinstance(devices, str):       # JSON null decodes as "" in Go
        if devices != "all":
            raise ValueError(f"{where}: invalid string input for 'devices': {cut(devices or '')}")
    elif isinstance(devices, list) and all(_is_int(d) for d in devices):
        devices = tuple(devices)
    else:
        # What to write instead, then mig-parted's message (both of its decoding attempts).
        bad = next((d for d in devices if not _is_int(d)), None) if isinstance(devices, list) else devices
        as_list = _go_unmarshal(bad, "int") if isinstance(devices, list) else _go_unmarshal(devices, "[]int")
        raise ValueError(f"{where}: 'devices' must be \"all\" or a list of GPU indices such as [0, 1], not "
                         f"{_json(devices)} (mig-parted: {_go_unmarshal(devices, 'string')}, {as_list})")

    enabled = raw["mig-enabled"]
    if not isinstance(enabled, bool):
        raise ValueError(f"{where}: invalid input for 'mig-enabled': {shown(enabled)} (expected true or false)")

    mig_devices = raw.get("mig-devices")
    if mig_devices is not None:
        if not isinstance(mig_devices, dict):
            raise ValueError(f"{where}: invalid input for 'mig-devices': expected a mapping of "
                             "profile names to counts")
        _check_mig_devices(mig_devices, where)
    if enabled and mig_devices is None:
        raise ValueError(f"{where}: missing required field 'mig-devices' when 'mig-enabled' is true")
    if not enabled and mig_devices:
        raise ValueError(f"{where}: MIG devices included when 'mig-enabled' is false")
    return ConfigEntry(devices=devices, mig_enabled=enabled,        # null counts decode as 0 in Go
                       mig_devices=tuple((str(k), v or 0) for k, v in (mig_devices or {}).items()),
                       device_filter=device_filter)


def _check_mig_devices(mig_devices: dict, where: str) -> None:
    """mig-parted's ``MigConfig.AssertValid``: names well formed, counts >= 0, not all 0."""
    prefix = f"{where}: error validating values in 'mig-devices' field"
    for name, count in mig_devices.items():
        if count is not None and not _is_int(count):
            hint = ("a string: write the number without quotes" if isinstance(count, str)
                    else "counts are whole numbers")
            raise ValueError(f"{where}: the count of '{cut(name)}' is {_json(count)}, {hint} "
                             f"(mig-parted: {_go_unmarshal(count, 'int')})")
        try:
            parse_profile(name)
        except ValueError as e:
            raise ValueError(f"{prefix}: invalid format for '{cut(name)}': {e}") from None
        if count is not None and count < 0:
            raise ValueError(f"{prefix}: invalid count for '{name}': {count}")
    if mig_devices and not any(mig_devices.values()):
        raise ValueError(f"{prefix}: all counts for all MigProfiles are 0")


def _json(value) -> str:
    import json
    return cut(json.dumps(value, default=str))


def _go_unmarshal(value, go_type: str) -> str:
    """encoding/json's error for decoding ``value`` into ``go_type``, as mig-parted reports it."""
    kind = {bool: "bool", str: "string", list: "array", dict: "object"}.get(type(value), "number")
    if kind == "number" and go_type == "int" and isinstance(value, float):
        kind = f"number {value:g}"
    return f"json: cannot unmarshal {kind} into Go value of type {go_type}"


def decode_document(text: str | bytes, source: str):
    """A mig-parted file's document (mapping keys stay strings as written: a config named
    ``off`` is not False)."""
    from ..textdoc import decode
    return decode(text, source, "mig-parted file")


def parse_spec(document, source: str = "<input>") -> MigSpec:
    """A v1 spec from YAML/JSON text or an already-parsed mapping."""
    if isinstance(document, (str, bytes)):
        document = decode_document(document, source)
    try:
        return MigSpec(_configs(document), source)
    except ValueError as e:
        raise ConfigError(str(e), where=source) from None
    except RecursionError:
        raise ConfigError("nested too deeply to be a MIG config file", where=source) from None


def _configs(doc) -> dict[str, tuple[ConfigEntry, ...]]:
    """As mig-parted's Spec.UnmarshalJSON: an empty file, or one with only its version, has
    no configs (selecting one then fails); an empty 'mig-configs' is an error."""
    if doc is None or doc == {}:
        return {}
    if not isinstance(doc, dict):
        raise ValueError("expected a mapping with 'version' and 'mig-configs'")
    if "version" not in doc:
        raise ValueError("unable to parse with missing 'version' field")
    if doc.get("version") != VERSION:
        raise ValueError(f"unknown version: {cut(str(doc.get('version', '')))}")
    for key in doc:
        if key not in ("version", "mig-configs"):
            raise ValueError(f"unexpected field: {cut(str(key))}")
    if "mig-configs" not in doc:
        return {}
    raw = doc["mig-configs"]
    if not isinstance(raw, dict) or not raw:
        raise ValueError("at least one entry in 'mig-configs' is required")
    configs = {}
    for name, entries in raw.items():
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"at least one entry in '{cut(str(name))}' is required")
        configs[str(name)] = tuple(_entry(e, f"mig-configs.{cut(str(name))}[{i}]") for i, e in enumerate(entries))
    return configs


def load_spec(path: str) -> MigSpec:
    """Read a config file; ``-`` reads standard input, as mig-parted does. Only a regular
    file of bounded size is read (a FIFO never blocks the command)."""
    from ..fileio import read_config_file
    return parse_spec(read_config_file(path, "MIG config file"), "<stdin>" if path == "-" else path)
