"""Keep the node's spec file current: regenerate, compare, write only when it changed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..devices import read_inventory
from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot
from ..lock import node_lock
from .discover import Discovery
from .render import render
from .spec import GeneratedSpec, SpecOptions, build_spec

__all__ = ["SpecChange", "configured_options", "generate", "refresh", "spec_path"]


@dataclass(frozen=True)
class SpecChange:
    path: str
    written: bool
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    common_changed: bool = False
    created: bool = False

    def describe(self) -> str:
        if not self.written:
            return f"{self.path}: unchanged"
        if self.created:
            return f"{self.path}: created with {len(self.added)} devices"
        parts = [f"{label} {', '.join(names)}" for label, names in
                 (("added", self.added), ("removed", self.removed), ("changed", self.changed)) if names]
        if self.common_changed:
            parts.append("common edits changed")
        return f"{self.path}: " + ("; ".join(parts) or "rewritten")


def configured_options(host: HostRoot, **options) -> SpecOptions:
    """SpecOptions with the hook interpreter /etc/hostagent/config.yaml names, if any."""
    from ..config import load_config
    interpreter = load_config(host.config_file).hook.interpreter     # None: this interpreter
    if interpreter:
        options.setdefault("hook_interpreter", interpreter)
    return SpecOptions(**options)


def spec_path(host: HostRoot, options: SpecOptions):
    return host.cdi_dir / f"{options.vendor}-{options.device_class}.json"


def generate(host: HostRoot, options: SpecOptions = SpecOptions(), inventory=None) -> GeneratedSpec:
    inventory = inventory or read_inventory(host)
    return build_spec(inventory, Discovery(host, inventory.driver_version), options)


def _diff(old: dict, new: dict) -> dict:
    def by_name(spec):
        return {d.get("name"): d for d in spec.get("devices", [])}
    before, after = by_name(old), by_name(new)
    return {"added": tuple(n for n in after if n not in before),
            "removed": tuple(n for n in before if n not in after),
            "changed": tuple(n for n in after if n in before and after[n] != before[n]),
            "common_changed": old.get("containerEdits") != new.get("containerEdits")
            or old.get("cdiVersion") != new.get("cdiVersion")}


def refresh(host: HostRoot, options: SpecOptions = SpecOptions(), *, dry_run: bool = False,
            inventory=None) -> tuple[SpecChange, GeneratedSpec]:
    """Regenerate the spec and write it (mode 0644, atomically) if its content changed."""
    with node_lock(host, "cdi refresh"):
        generated = generate(host, options, inventory)
        text = render(generated.spec)
        path = spec_path(host, options)
        try:
            old_text = path.read_text()
        except FileNotFoundError:
            old_text = None
        if old_text == text:
            return SpecChange(str(path), written=False), generated
        try:
            old = json.loads(old_text) if old_text else {}
        except ValueError:
            old = {}
        change = SpecChange(str(path), written=True, created=old_text is None, **_diff(old, generated.spec))
        if not dry_run:
            ensure_dir(path.parent, 0o755)
            write_atomic(path, text, mode=0o644)
        return change, generated
