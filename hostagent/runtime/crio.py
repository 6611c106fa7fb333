"""CRI-O: one drop-in under ``/etc/crio/crio.conf.d/``; the main file is never written.

CRI-O decodes each drop-in over its configuration in file-name order, so the drop-in
holds only ``[crio.runtime.runtimes.<name>]`` (and ``default_runtime`` with
``--set-as-default``). The runtime copies the keys of the default runtime (unless that is
ours), else ``runc``, else ``crun``, as read from the main file and the other drop-ins,
with ``runtime_path`` set to the shim and ``runtime_type = "oci"``.
CRI-O 1.24+ always has CDI; ``--cdi`` only writes ``cdi_spec_dirs`` when they differ from
CRI-O's defaults.
"""

from __future__ import annotations

import posixpath

from ..errors import ConfigError, UsageError
from . import tomledit as t
from .engine import DEFAULT_CDI_DIRS

__all__ = ["Crio", "build", "sources", "DEFAULT_CONFIG", "DEFAULT_DROP_IN", "SERVICE"]

DEFAULT_CONFIG = "/etc/crio/crio.conf"
DEFAULT_DROP_IN = "/etc/crio/crio.conf.d/99-hostagent.toml"
SERVICE = "crio"
HEADER = ("Written by 'hostagent runtime configure'; 'hostagent runtime revert' undoes it.",
          "CRI-O reads this after {config} and the drop-ins named before it.")


def sources(config: str, drop_in: str | None) -> list[str]:
    """Files read (host paths; globs allowed): the main file, then the other drop-ins."""
    if not drop_in:
        raise UsageError("CRI-O is configured through a drop-in only; hostagent never edits its main file",
                         hint="leave out --no-drop-in, or give --drop-in FILE")
    return [config, posixpath.join(posixpath.dirname(drop_in), "*")]


def build(texts: dict[str, str | None], config: str, drop_in: str | None) -> "Crio":
    sources(config, drop_in)
    return Crio(config, drop_in, [(p, text) for p, text in texts.items() if p != drop_in and text is not None])


def _mapping(data: dict, keys, where: str, prefix: str = "") -> dict:
    """``data[k1][k2]...`` as a dict ({} when absent); anything else is an error."""
    for i, key in enumerate(keys):
        data = data.get(key, {})
        if not isinstance(data, dict):
            raise ConfigError(f"{prefix}{'.'.join(keys[:i + 1])} is a {type(data).__name__}, not a table",
                              where=where)
    return data


class Crio:
    name = "crio"

    def __init__(self, config: str, drop_in: str, texts: list[tuple[str, str]]):
        import tomlkit
        self.config, self.drop_in, self.notes = config, drop_in, []
        # The effective runtime settings: later files override earlier ones, key by key.
        self.default, self.runtimes = "", {}
        for path, text in texts:
            runtime = _mapping(t.unwrap(t.parse(text, path)), ("crio", "runtime"), path)
            default = runtime.get("default_runtime", self.default)
            if not isinstance(default, str):
                raise ConfigError(f"crio.runtime.default_runtime is a {type(default).__name__}, not a string",
                                  where=path)
            self.default = default
            for name in _mapping(runtime, ("runtimes",), path, "crio.runtime."):
                self.runtimes.setdefault(name, {}).update(
                    _mapping(runtime, ("runtimes", name), path, "crio.runtime."))
        self.doc = tomlkit.document()
        for line in HEADER:
            self.doc.add(tomlkit.comment(line.format(config=config)))

    def _runtime_table(self):
        return t.ensure_table(self.doc, ["crio", "runtime"])

    def add_runtime(self, name: str, binary: str) -> None:
        candidates = [self.default] if self.default and self.default != name else []
        source = next((n for n in candidates + ["runc", "crun"] if n in self.runtimes), None)
        entry = {k: v for k, v in (self.runtimes.get(source) or {}).items()
                 if k not in ("runtime_path", "runtime_type")}
        table = t.ensure_table(self._runtime_table(), ["runtimes", name])
        t.set_value(table, "runtime_path", binary)
        t.set_value(table, "runtime_type", "oci")
        for key, value in entry.items():
            t.set_value(table, key, value)
        self.notes.append(f"runtime {name!r} runs {binary}" + (f" with the settings of {source!r}" if source else ""))

    def set_default(self, name: str, enable: bool) -> None:
        if enable:
            t.set_value(self._runtime_table(), "default_runtime", name)
        elif self.default == name:
            self.notes.append(f"{name!r} is still the default runtime: another CRI-O file sets it")

    def enable_cdi(self, spec_dirs) -> None:
        if tuple(spec_dirs) != DEFAULT_CDI_DIRS:
            t.set_value(self._runtime_table(), "cdi_spec_dirs", list(spec_dirs))
        self.notes.append("CRI-O 1.24 and later always read CDI specs; older ones need the shim")

    def render(self) -> dict[str, str | None]:
        text = t.dumps(self.doc)
        return {self.drop_in: text if text.endswith("\n") else text + "\n"}
