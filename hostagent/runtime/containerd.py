"""containerd: config versions 1, 2 and 3, edited in place or through a drop-in.

- Version: an empty file is version 2 (containerd's default); a file without ``version``
  is version 1; otherwise 1, 2 or 3, anything else is refused.
- The CRI plugin section differs per version (``CRI_KEYS``); runtimes live under
  ``<cri>.containerd.runtimes``, ``enable_cdi``/``cdi_spec_dirs`` in ``<cri>``.
- The new runtime copies the table of the default runtime (unless that is ours or an
  ``nvidia*`` one), else ``runc``, else ``crun``, so ``SystemdCgroup`` and friends carry
  over; ``options.BinaryName`` (``options.Runtime`` for the legacy v1 linux shim) points
  at the shim.
- Drop-in (default for v2/v3; v1 has no imports): the drop-in holds ``version`` (equal to
  the root's: containerd 2.x breaks on a mismatch) and the whole CRI section as containerd
  sees it up to the drop-in (the root file and the imports it reads before; see
  ``containerd_imports``) with the edits, because containerd before 2.1 replaces a
  plugin's section wholesale from an import (containerd#5837). The root file only gains
  an ``imports`` entry for the drop-in, unless an existing import already covers it. A
  file containerd reads after the drop-in (or, editing in place, after the root) that
  carries the CRI section would undo the edits: refused.
"""

from __future__ import annotations

import copy
import posixpath

from ..errors import ConfigError, UsageError
from . import containerd_imports as imports
from . import tomledit as t

__all__ = ["Containerd", "build", "DEFAULT_CONFIG", "DROP_IN_NAME", "SERVICE", "CRI_KEYS", "detect_version"]

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DROP_IN_NAME = "conf.d/99-hostagent.toml"     # beside the main file
SERVICE = "containerd"
CRI_KEYS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
RUNC_V2 = "io.containerd.runc.v2"
LEGACY_LINUX = "io.containerd.runtime.v1.linux"     # its options name the binary "Runtime"
HEADER = "Written by 'hostagent runtime configure'; 'hostagent runtime revert' undoes it."
COPY_HEADER = ("The CRI plugin section containerd has from {sources}, with hostagent's runtime:",
               "containerd before 2.1 replaces a plugin's whole section from an import.")
NEW_HEADER = ("hostagent's runtime in the CRI plugin section, which no file read before this one sets.",)


def detect_version(doc, text: str, where: str) -> int:
    if not t.unwrap(doc):
        return 2
    if "version" not in doc:
        return 1
    version = t.unwrap(doc["version"])
    if isinstance(version, bool) or version not in CRI_KEYS:
        raise ConfigError(f"unknown containerd config version {version!r}", where=where,
                          hint="hostagent knows versions 1, 2 and 3")
    return version


def build(reader, config: str, drop_in: str | None, *, explicit: bool = True) -> "Containerd":
    return Containerd(reader, config, drop_in, explicit=explicit)


class Containerd:
    name = "containerd"

    def __init__(self, reader, config: str, drop_in: str | None, *, explicit: bool = True):
        self.config, self.notes = config, []
        text = reader.text(config) or ""
        self.root = t.parse(text, config)
        self.version = detect_version(self.root, text, config)
        self.cri_key = CRI_KEYS[self.version]
        grpc = t.get_table(self.root, ["grpc"])
        # Where this containerd listens: a restart without systemd signals its owner.
        self.socket = str(t.unwrap(grpc.get("address", ""))) if grpc is not None else ""
        if drop_in and self.version == 1:
            if explicit:
                raise UsageError(f"{config} is a version 1 config, which has no imports",
                                 hint="use --no-drop-in to edit it in place, or migrate it to version 2")
            drop_in = None
            self.notes.append(f"{config} is a version 1 config (no imports): editing it in place")
        self.drop_in = drop_in
        listed = imports.imports_of(self.root, config)
        # The root file gains an import for the drop-in unless one already names it.
        self.add_import = bool(drop_in) and not any(imports.covers(i, config, drop_in) for i in listed)
        loaded = imports.load_order(reader, config, self.root, listed + [drop_in] * self.add_import, drop_in)
        ours = drop_in or config
        at = [path for path, _ in loaded].index(ours)
        self._refuse_later(loaded[at + 1:], ours)
        self.source = config          # the file the CRI section comes from (for errors)
        self.target = self._drop_in_document(loaded[:at]) if drop_in else self.root

    def _refuse_later(self, later, ours: str) -> None:
        found = imports.first_with_section(later, self.cri_key)
        if found is None:
            return
        if self.drop_in and posixpath.dirname(found) == posixpath.dirname(self.drop_in):
            hint = (f"give a --drop-in whose name sorts after {posixpath.basename(found)} "
                    f"(for example {posixpath.join(posixpath.dirname(found), 'zz-hostagent.toml')}), "
                    "or remove that file's CRI section")
        elif self.drop_in:
            hint = "remove that file's CRI section, or move its settings into " + self.config
        else:
            hint = "leave out --no-drop-in (a drop-in read after it), or remove that file's CRI section"
        raise ConfigError(f"sets the CRI plugin section and containerd reads it after {ours}, "
                          "so it would undo hostagent's runtime (containerd before 2.1 replaces the whole section)",
                          where=found, hint=hint + "; nothing was changed")

    def _drop_in_document(self, before):
        """The drop-in: ``version`` and the CRI section containerd has up to it (merged table
        by table for version 3, whose readers from containerd 2.1 do so)."""
        import tomlkit
        section, sources = imports.effective_section(before, self.cri_key, merge=self.version >= 3)
        self.source = sources[-1] if sources else self.config
        doc = tomlkit.document()
        for line in (HEADER, *(COPY_HEADER if sources else NEW_HEADER)):
            doc.add(tomlkit.comment(line.format(sources=", ".join(sources))))
        doc["version"] = self.version
        if section is not None:
            doc["plugins"] = tomlkit.table(is_super_table=True)
            owner = dict(before)[sources[-1]]
            doc["plugins"].append(t.original_key(owner["plugins"], self.cri_key), copy.deepcopy(section))
        if len(sources) > 1:
            self.notes.append(f"the CRI section in {self.drop_in} merges those of {', '.join(sources)}, as "
                              "containerd 2.1 and later do (containerd 2.0 used only the last one)")
        return doc

    def _cri(self):
        return t.ensure_table(self.target, ["plugins", self.cri_key], self.source)

    def add_runtime(self, name: str, binary: str) -> None:
        cri = self._cri()
        runtimes = t.ensure_table(cri, ["containerd", "runtimes"], self.source, ("plugins", self.cri_key))
        default = t.unwrap(t.get_table(cri, ["containerd"]).get("default_runtime_name", ""))
        if not isinstance(default, str):
            raise ConfigError(f"default_runtime_name is a {type(default).__name__}, not a string", where=self.source)
        candidates = [default] if default and default != name and not default.startswith("nvidia") else []
        prefix = ("plugins", self.cri_key, "containerd", "runtimes")
        source = next((n for n in candidates + ["runc", "crun"]
                       if t.get_table(runtimes, [n], self.source, prefix) is not None), None)
        want = copy.deepcopy(t.unwrap(runtimes[source])) if source else {}
        want["runtime_type"] = want.get("runtime_type") or RUNC_V2
        binary_key = "Runtime" if want["runtime_type"] == LEGACY_LINUX else "BinaryName"
        if not isinstance(want.get("options", {}), dict):
            raise ConfigError(f"{t.dotted([*prefix, source, 'options'])} is not a table", where=self.source)
        want.setdefault("options", {})[binary_key] = binary
        if name in runtimes and t.unwrap(runtimes[name]) == want:
            return                                   # already as wanted: leave its layout alone
        t.remove_key(runtimes, name)
        if source:
            entry = t.copy_table(runtimes, name, runtimes[source])
            t.set_value(entry, "runtime_type", want["runtime_type"])
            t.set_value(t.ensure_table(entry, ["options"]), binary_key, binary)
        else:
            runtimes[name] = want
            neighbour = t.get_table(cri, ["containerd"])
            t.indent_new(runtimes[name], (neighbour is not None and t.value_indent(neighbour)) or "")
        self.notes.append(f"runtime {name!r} runs {binary}" +
                          (f" with the options of {source!r}" if source else ""))

    def set_default(self, name: str, enable: bool) -> None:
        section = t.get_table(self._cri(), ["containerd"])
        if enable:
            t.set_value(t.ensure_table(self._cri(), ["containerd"]), "default_runtime_name", name)
        elif section is not None and t.unwrap(section.get("default_runtime_name")) == name:
            t.remove_key(section, "default_runtime_name")     # back to containerd's default, runc

    def enable_cdi(self, spec_dirs) -> None:
        cri = self._cri()
        t.set_value(cri, "enable_cdi", True)
        t.set_value(cri, "cdi_spec_dirs", list(spec_dirs))
        self.notes.append("enable_cdi needs containerd 1.7 or later; older ones ignore it and need the shim")

    def render(self) -> dict[str, str | None]:
        if not self.drop_in:
            return {self.config: t.dumps(self.root)}
        root = self.root
        if "version" not in root:
            root["version"] = self.version
        if self.add_import:
            if "imports" in root:
                root["imports"].append(self.drop_in)
            else:
                root["imports"] = [self.drop_in]
        return {self.config: t.dumps(root), self.drop_in: t.dumps(self.target)}
