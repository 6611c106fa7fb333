"""CRI-O: one drop-in under ``/etc/crio/crio.conf.d/``; the main file is never written.

CRI-O decodes each drop-in over its configuration in file-name order, so the drop-in
holds only ``[crio.runtime.runtimes.<name>]`` (and ``default_runtime`` with
``--set-as-default``). The runtime copies the keys of the default runtime (unless that is
ours or an ``nvidia*`` one, whose settings belong to another vendor's runtime), else
``runc``, else ``crun``, as read from the main file and the drop-ins, with
``runtime_path`` set to the shim and ``runtime_type = "oci"``.
A drop-in read after ours that sets what ours sets (another ``default_runtime`` with
``--set-as-default``, our runtime's ``runtime_path``/``runtime_type``, other
``cdi_spec_dirs``) would silently win: refused, naming it.
CRI-O 1.24+ always has CDI; ``--cdi`` only writes ``cdi_spec_dirs`` when they differ from
CRI-O's defaults.
"""

from __future__ import annotations

import posixpath

from ..errors import ConfigError, UsageError
from . import tomledit as t
from .engine import DEFAULT_CDI_DIRS

__all__ = ["Crio", "build", "DEFAULT_CONFIG", "DROP_IN_NAME", "SERVICE"]

DEFAULT_CONFIG = "/etc/crio/crio.conf"
DROP_IN_NAME = "crio.conf.d/99-hostagent.toml"     # beside the main file
SERVICE = "crio"
HEADER = ("Written by 'hostagent runtime configure'; 'hostagent runtime revert' undoes it.",
          "CRI-O reads this after {config} and the drop-ins named before it.")


def build(reader, config: str, drop_in: str | None, *, explicit: bool = True) -> "Crio":
    """From the main file, then the drop-ins in the drop-in's folder in name order."""
    if not drop_in:
        raise UsageError("CRI-O is configured through a drop-in only; hostagent never edits its main file",
                         hint="leave out --no-drop-in, or give --drop-in FILE")
    drop_ins = [p for p in reader.glob(posixpath.join(posixpath.dirname(drop_in), "*")) if p != drop_in]
    texts = [(p, reader.text(p)) for p in [config] + drop_ins if reader.text(p) is not None]
    return Crio(config, drop_in, texts, later={p for p in drop_ins if p > drop_in})


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

    def __init__(self, config: str, drop_in: str, texts: list[tuple[str, str]], later=frozenset()):
        import tomlkit
        self.config, self.drop_in, self.notes = config, drop_in, []
        # The effective runtime settings: later files override earlier ones, key by key.
        self.default, self.runtimes = "", {}
        self.later = []          # (path, its crio.runtime table) of the files CRI-O reads after ours
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
            if path in later:
                self.later.append((path, runtime))
        self.doc = tomlkit.document()
        for line in HEADER:
            self.doc.add(tomlkit.comment(line.format(config=config)))

    def _refuse_later(self, key: str, ours, get) -> None:
        """Refuse when a file read after the drop-in sets ``key`` (found by ``get`` in its
        crio.runtime table) to something other than ``ours``."""
        for path, runtime in self.later:
            value = get(runtime)
            if value is not None and value != ours:
                example = posixpath.join(posixpath.dirname(self.drop_in), "zz-hostagent.toml")
                raise ConfigError(f"sets {key} = {value!r}, and CRI-O reads it after {self.drop_in}, so hostagent's "
                                  f"{ours!r} would not take effect", where=path,
                                  hint=f"give a --drop-in whose name sorts after it (for example {example}), or "
                                       "remove that setting from it; nothing was changed")

    def _runtime_table(self):
        return t.ensure_table(self.doc, ["crio", "runtime"])

    def add_runtime(self, name: str, binary: str) -> None:
        candidates = [self.default] if self.default and self.default != name \
            and not self.default.startswith("nvidia") else []
        source = next((n for n in candidates + ["runc", "crun"] if n in self.runtimes), None)
        entry = {k: v for k, v in (self.runtimes.get(source) or {}).items()
                 if k not in ("runtime_path", "runtime_type")}
        for key, value in (("runtime_path", binary), ("runtime_type", "oci")):
            self._refuse_later(f"crio.runtime.runtimes.{name}.{key}", value,
                               lambda r, key=key: ((r.get("runtimes") or {}).get(name) or {}).get(key))
        table = t.ensure_table(self._runtime_table(), ["runtimes", name])
        t.set_value(table, "runtime_path", binary)
        t.set_value(table, "runtime_type", "oci")
        for key, value in entry.items():
            t.set_value(table, key, value)
        self.notes.append(f"runtime {name!r} runs {binary}" + (f" with the settings of {source!r}" if source else ""))

    def set_default(self, name: str, enable: bool) -> None:
        if enable:
            self._refuse_later("crio.runtime.default_runtime", name, lambda r: r.get("default_runtime"))
            t.set_value(self._runtime_table(), "default_runtime", name)
        elif self.default == name:
            self.notes.append(f"{name!r} is still the default runtime: another CRI-O file sets it")

    def enable_cdi(self, spec_dirs) -> None:
        if tuple(spec_dirs) != DEFAULT_CDI_DIRS:
            self._refuse_later("crio.runtime.cdi_spec_dirs", list(spec_dirs), lambda r: r.get("cdi_spec_dirs"))
            t.set_value(self._runtime_table(), "cdi_spec_dirs", list(spec_dirs))
        self.notes.append("CRI-O 1.24 and later always read CDI specs; older ones need the shim")

    def render(self) -> dict[str, str | None]:
        text = t.dumps(self.doc)
        return {self.drop_in: text if text.endswith("\n") else text + "\n"}
