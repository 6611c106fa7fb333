"""Keep the node's spec file current: regenerate, compare, write only when it changed."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

from ..devices import read_inventory
from ..fileio import ensure_dir, remove, remove_stale_temporaries, write_atomic
from ..hostroot import HostRoot
from ..lock import node_lock
from .discover import Discovery
from .render import render
from .spec import GeneratedSpec, NothingToDescribe, SpecOptions, build_spec

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
    empty: bool = False          # nothing to describe: no spec (an existing one is removed)
    mode_fixed: bool = False     # same content, but not mode 0644: rewritten for the mode

    def describe(self) -> str:
        if self.empty:
            done = "removed" if self.written else "not written"
            return f"{self.path}: {done} (no GPU or MIG device to describe)"
        if not self.written:
            return f"{self.path}: unchanged"
        if self.created:
            return f"{self.path}: created with {len(self.added)} devices"
        if self.mode_fixed:
            return f"{self.path}: content unchanged, mode set to 0644 (engines of other users must read it)"
        parts = [f"{label} {', '.join(names)}" for label, names in
                 (("added", self.added), ("removed", self.removed), ("changed", self.changed)) if names]
        if self.common_changed:
            parts.append("common edits changed")
        return f"{self.path}: " + ("; ".join(parts) or "rewritten")


def configured_options(host: HostRoot, **options) -> SpecOptions:
    """SpecOptions with the hook interpreter /etc/hostagent/config.yaml names, if any (no
    hook where it says so: ``hook.in_cdi_specs``), and the hook program's home on the host
    (``hookhome``)."""
    from ..config import load_config
    from .hookhome import hook_home, hook_in_specs
    config = load_config(host.config_file)
    hook = config.section("hook")
    home = hook_home(host, hook["interpreter"], in_specs=hook_in_specs(host, hook, config.source))
    options.setdefault("hook_interpreter", home.spec_interpreter)
    options.setdefault("hook_import_path", home.import_path)
    return SpecOptions(**options)


def spec_path(host: HostRoot, options: SpecOptions):
    return host.cdi_dir / f"{options.vendor}-{options.device_class}.json"


def generate(host: HostRoot, options: SpecOptions = SpecOptions(), inventory=None) -> GeneratedSpec:
    inventory = inventory or read_inventory(host)
    return build_spec(inventory, Discovery(host, inventory.driver_version), options)


def _diff(old: dict, new: dict) -> dict:
    def by_name(spec):                    # an old spec may have been edited by hand: take what fits
        devices = spec.get("devices")
        return {d["name"]: d for d in devices if isinstance(d, dict) and isinstance(d.get("name"), str)} \
            if isinstance(devices, list) else {}
    before, after = by_name(old), by_name(new)
    return {"added": tuple(n for n in after if n not in before),
            "removed": tuple(n for n in before if n not in after),
            "changed": tuple(n for n in after if n in before and after[n] != before[n]),
            "common_changed": old.get("containerEdits") != new.get("containerEdits")
            or old.get("cdiVersion") != new.get("cdiVersion")}


def refresh(host: HostRoot, options: SpecOptions = SpecOptions(), *, dry_run: bool = False,
            inventory=None) -> tuple[SpecChange, GeneratedSpec]:
    """Regenerate the spec and write it (mode 0644, atomically) if its content or mode
    differs. When no device can be described, the spec is removed: engines would otherwise
    offer devices whose nodes are gone."""
    with node_lock(host, "cdi refresh"):
        path = spec_path(host, options)
        old_text, old_mode = _read(path)
        try:
            generated = generate(host, options, inventory)
        except NothingToDescribe as e:
            if not dry_run:
                remove_stale_temporaries(str(path.parent), path.name)
                if old_text is not None:
                    remove(path)
            change = SpecChange(str(path), written=old_text is not None, empty=True,
                                removed=_diff(_parse(old_text), {})["removed"])
            return change, GeneratedSpec(spec=None, problems=(*e.left_out, e))
        text = render(generated.spec)
        if host.mounted and not dry_run:     # the hook the spec names, on the host (this version's)
            from .hookhome import install_hook_program
            install_hook_program(host)
        if old_text == text and old_mode == 0o644:
            if not dry_run:              # nothing to write: what killed writers left goes all the same
                remove_stale_temporaries(str(path.parent), path.name)
            return SpecChange(str(path), written=False), generated
        change = SpecChange(str(path), written=True, created=old_text is None, mode_fixed=old_text == text,
                            **_diff(_parse(old_text), generated.spec))
        if not dry_run:
            ensure_dir(path.parent, 0o755)
            write_atomic(path, text, mode=0o644)
        return change, generated


def _read(path) -> tuple[str | None, int | None]:
    try:
        with open(path) as f:
            return f.read(), stat.S_IMODE(os.fstat(f.fileno()).st_mode)
    except FileNotFoundError:
        return None, None


def _parse(text: str | None) -> dict:
    try:
        old = json.loads(text) if text else {}
    except ValueError:
        return {}
    return old if isinstance(old, dict) else {}
