"""Docker: ``/etc/docker/daemon.json``, edited in place (dockerd has no drop-ins).

``runtimes.<name> = {"path": <shim>, "args": []}``, ``default-runtime`` with
``--set-as-default`` (and removed again without it when it names ours), ``features.cdi``
with ``--cdi`` (Docker 25+; on by default from 28.2) plus ``cdi-spec-dirs`` when they
differ from the defaults. Key order and the file's indentation are kept.
"""

from __future__ import annotations

import json
import re

from ..errors import ConfigError, UsageError
from .engine import DEFAULT_CDI_DIRS

__all__ = ["Docker", "build", "DEFAULT_CONFIG", "DROP_IN_NAME", "SERVICE"]

DEFAULT_CONFIG = "/etc/docker/daemon.json"
DROP_IN_NAME = None     # dockerd reads daemon.json only
SERVICE = "docker"


def build(reader, config: str, drop_in: str | None, *, explicit: bool = True) -> "Docker":
    if drop_in:
        raise UsageError("dockerd has no drop-in files", hint="leave out --drop-in; daemon.json is edited in place")
    return Docker(config, reader.text(config) or "")


class Docker:
    name = "docker"

    def __init__(self, config: str, text: str):
        self.config, self.drop_in, self.notes = config, None, []
        try:
            self.data = json.loads(text) if text.strip() else {}
        except ValueError as e:
            from ..docerrors import syntax_error
            raise syntax_error(e, config, "JSON", hint="fix the file by hand; nothing was changed") from None
        if not isinstance(self.data, dict):
            raise ConfigError("is not a JSON object", where=config)
        found = re.search(r"^\{\s*\n([ \t]+)\S", text)
        self.indent = found.group(1) if found else "    "

    def _object(self, key: str) -> dict:
        value = self.data.setdefault(key, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{key} is not a JSON object", where=self.config)
        return value

    def add_runtime(self, name: str, binary: str) -> None:
        self._object("runtimes")[name] = {"path": binary, "args": []}
        self.notes.append(f"runtime {name!r} runs {binary}")

    def set_default(self, name: str, enable: bool) -> None:
        if enable:
            self.data["default-runtime"] = name
        elif self.data.get("default-runtime") == name:
            del self.data["default-runtime"]

    def enable_cdi(self, spec_dirs) -> None:
        self._object("features")["cdi"] = True
        if tuple(spec_dirs) != DEFAULT_CDI_DIRS:
            self.data["cdi-spec-dirs"] = list(spec_dirs)
        self.notes.append("CDI in Docker needs 25.0 or later")

    def render(self) -> dict[str, str | None]:
        return {self.config: json.dumps(self.data, indent=self.indent) + "\n"}
