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
  the root's: containerd 2.x breaks on a mismatch) and a copy of the root's whole CRI
  section with the edits, because containerd before 2.1 replaces a plugin's section
  wholesale from an import (containerd#5837). The root file only gains an ``imports``
  entry for the drop-in, unless an existing import already covers it.
"""

from __future__ import annotations

import copy
import fnmatch

from ..errors import ConfigError, UsageError
from . import tomledit as t

__all__ = ["Containerd", "build", "sources", "DEFAULT_CONFIG", "DEFAULT_DROP_IN", "SERVICE", "CRI_KEYS",
           "detect_version"]

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_DROP_IN = "/etc/containerd/conf.d/99-hostagent.toml"
SERVICE = "containerd"
CRI_KEYS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
RUNC_V2 = "io.containerd.runc.v2"
LEGACY_LINUX = "io.containerd.runtime.v1.linux"     # its options name the binary "Runtime"
DROP_IN_HEADER = ("Written by 'hostagent runtime configure'; 'hostagent runtime revert' undoes it.",
                  "A copy of the CRI plugin section of {root} with hostagent's runtime: containerd",
                  "before 2.1 replaces a plugin's whole section from an import.")


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


def sources(config: str, drop_in: str | None) -> list[str]:
    """Files this engine reads (host paths); the drop-in is only written."""
    return [config]


def build(texts: dict[str, str | None], config: str, drop_in: str | None) -> "Containerd":
    return Containerd(config, texts.get(config) or "", drop_in)


class Containerd:
    name = "containerd"

    def __init__(self, config: str, text: str, drop_in: str | None):
        self.config, self.drop_in, self.notes = config, drop_in, []
        self.root = t.parse(text, config)
        self.version = detect_version(self.root, text, config)
        self.cri_key = CRI_KEYS[self.version]
        grpc = t.get_table(self.root, ["grpc"])
        # Where this containerd listens: a restart without systemd signals its owner.
        self.socket = str(t.unwrap(grpc.get("address", ""))) if grpc is not None else ""
        if drop_in and self.version == 1:
            raise UsageError(f"{config} is a version 1 config, which has no imports",
                             hint="use --no-drop-in to edit it in place, or migrate it to version 2")
        if drop_in:
            import tomlkit
            self.target = tomlkit.document()
            for line in DROP_IN_HEADER:
                self.target.add(tomlkit.comment(line.format(root=config)))
            self.target["version"] = self.version
            source = t.get_table(self.root, ["plugins", self.cri_key], config)
            if source is not None:
                self.target["plugins"] = tomlkit.table(is_super_table=True)
                key = t.original_key(self.root["plugins"], self.cri_key)
                self.target["plugins"].append(key, copy.deepcopy(source))
        else:
            self.target = self.root

    def _cri(self):
        return t.ensure_table(self.target, ["plugins", self.cri_key], self.config)

    def add_runtime(self, name: str, binary: str) -> None:
        runtimes = t.ensure_table(self._cri(), ["containerd", "runtimes"], self.config)
        default = t.unwrap(t.get_table(self._cri(), ["containerd"]).get("default_runtime_name", ""))
        if not isinstance(default, str):
            raise ConfigError(f"default_runtime_name is a {type(default).__name__}, not a string", where=self.config)
        candidates = [default] if default and default != name and not default.startswith("nvidia") else []
        source = next((n for n in candidates + ["runc", "crun"] if t.get_table(runtimes, [n]) is not None), None)
        want = copy.deepcopy(t.unwrap(runtimes[source])) if source else {}
        want["runtime_type"] = want.get("runtime_type") or RUNC_V2
        binary_key = "Runtime" if want["runtime_type"] == LEGACY_LINUX else "BinaryName"
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
            neighbour = t.get_table(self._cri(), ["containerd"])
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
        imports = t.unwrap(root.get("imports", []))
        if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
            raise ConfigError("imports is not a list of paths", where=self.config)
        if not any(fnmatch.fnmatchcase(self.drop_in, pattern) for pattern in imports):
            if "imports" in root:
                root["imports"].append(self.drop_in)
            else:
                root["imports"] = [self.drop_in]
        return {self.config: t.dumps(root), self.drop_in: t.dumps(self.target)}
