"""Build the node's CDI spec from the inventory and what discovery found on the host."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..devices import Inventory
from ..errors import HostagentError, UsageError
from .discover import Discovery, MissingDeviceNode
from .edits import Edits, Hook
from .naming import device_name
from .validate import check_kind
from .version import KNOWN_VERSIONS, minimum_version, version_key

__all__ = ["SpecOptions", "GeneratedSpec", "build_spec", "hook_command", "HOOK_ENV", "common_edits",
           "edits_to_cdi"]

# Hooks never inherit the container's environment: the spec gives them this one.
HOOK_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
# Where this hostagent is installed: the hook imports it from here and nothing else.
HOOK_IMPORT_PATH = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class SpecOptions:
    vendor: str = "nvidia.com"
    device_class: str = "gpu"
    name_strategies: tuple[str, ...] = ("index", "uuid")
    all_device: bool = True
    cdi_version: str = "auto"
    hook_interpreter: str = field(default_factory=lambda: sys.executable)
    hook_import_path: str = HOOK_IMPORT_PATH

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.device_class}"


@dataclass(frozen=True)
class GeneratedSpec:
    spec: dict
    problems: tuple[HostagentError, ...]    # devices left out, and why

    @property
    def device_names(self) -> list[str]:
        return [d["name"] for d in self.spec["devices"]]


def hook_command(interpreter: str, verb: str, *args: str, import_path: str = HOOK_IMPORT_PATH) -> Hook:
    """One run of the hook program, at every container start, so it starts lean:

    ``-I`` (no PYTHON* variables, user site or script directory), ``-S`` (no site
    processing: tens of milliseconds on hosts with many packages) and the one directory
    hostagent is installed in appended after the standard library; an explicit env.
    argv[0] is the interpreter's full path, from which Python finds its standard library
    (a bare "python3" would be looked up on PATH and may name another installation).
    """
    boot = (f"import sys;sys.path.append({import_path!r});"
            "from hostagent.hooks.main import main;sys.exit(main())")
    return Hook(path=interpreter, args=(interpreter, "-I", "-S", "-c", boot, verb, *args), env=HOOK_ENV)


def _hooks(edits: Edits, interpreter: str, verb: str, import_path: str = HOOK_IMPORT_PATH) -> tuple[Hook, ...]:
    args = [a for target, link in edits.links for a in ("--link", f"{target}::{link}")]
    args += [a for folder in edits.folders for a in ("--folder", folder)]
    return (hook_command(interpreter, verb, *args, import_path=import_path),) if args else ()


def edits_to_cdi(edits: Edits, interpreter: str, *, common: bool = False,
                 import_path: str = HOOK_IMPORT_PATH) -> dict:
    """A device's (or, with ``common``, the spec's) ``containerEdits``, links and folders
    turned into the hook run that makes them."""
    return edits.to_cdi(_hooks(edits, interpreter, "prepare" if common else "create-symlinks", import_path))


def common_edits(discovery: Discovery) -> Edits:
    """What every container using any of the node's devices needs, once."""
    return Edits.merge(Edits(env=("NVIDIA_VISIBLE_DEVICES=void",)), discovery.control_nodes(),
                       discovery.libraries(), discovery.binaries(), discovery.ipc(),
                       discovery.firmware(), discovery.config_files())


def build_spec(inventory: Inventory, discovery: Discovery, options: SpecOptions = SpecOptions()) -> GeneratedSpec:
    check_kind(options.kind)
    problems: list[HostagentError] = [
        HostagentError(f"GPU {bad.index} is left out: {bad.error}") for bad in inventory.unreadable]

    per_device: list[tuple[object, Edits]] = []
    for gpu in inventory.gpus:
        targets = gpu.mig.devices if gpu.mig_enabled else (gpu,)
        for dev in targets:
            try:
                edits = discovery.mig_device(dev) if dev is not gpu else discovery.gpu(gpu)
            except MissingDeviceNode as e:
                label = f"MIG device {dev.name} ({dev.uuid})" if dev is not gpu else f"GPU {gpu.index}"
                problems.append(MissingDeviceNode(f"{label} is left out: {e.what}", where=e.where, hint=e.hint))
                continue
            per_device.append((dev, edits))

    devices = []
    for dev, edits in per_device:
        body = edits_to_cdi(edits, options.hook_interpreter, import_path=options.hook_import_path)
        devices += [{"name": device_name(dev, s), "containerEdits": body} for s in options.name_strategies]
    if options.all_device and per_device:
        union = Edits.merge(*(e for _, e in per_device))
        devices.append({"name": "all",
                        "containerEdits": edits_to_cdi(union, options.hook_interpreter,
                                                       import_path=options.hook_import_path)})
    if not devices:
        raise HostagentError("no GPU or MIG device could be described; a CDI spec needs at least one",
                             hint="; ".join(p.message for p in problems) or "is MIG enabled with no instances?")

    common = common_edits(discovery)
    spec = {"cdiVersion": "", "kind": options.kind, "devices": devices,
            "containerEdits": edits_to_cdi(common, options.hook_interpreter, common=True,
                                           import_path=options.hook_import_path)}
    spec["cdiVersion"] = _version(spec, options.cdi_version)
    return GeneratedSpec(spec=spec, problems=tuple(problems))


def _version(spec: dict, requested: str) -> str:
    needed = minimum_version(spec)
    if requested == "auto":
        return needed
    requested = requested.removeprefix("v")
    if requested not in KNOWN_VERSIONS:
        raise UsageError(f"unknown CDI version {requested}", hint=f"use auto or one of {', '.join(KNOWN_VERSIONS)}")
    if version_key(requested) < version_key(needed):
        raise UsageError(f"this spec needs cdiVersion {needed} or newer, not {requested}",
                         hint="use --cdi-version auto")
    return requested
