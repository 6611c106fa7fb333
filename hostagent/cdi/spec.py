"""Build the node's CDI spec from the inventory and what discovery found on the host."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..devices import Inventory
from ..errors import HostagentError, StateError, UsageError
from .discover import Discovery, MissingDeviceNode
from .edits import Edits, Hook
from .naming import device_name
from .validate import DEVICE_RE, check_kind
from .version import KNOWN_VERSIONS, minimum_version, version_key

__all__ = ["SpecOptions", "GeneratedSpec", "NothingToDescribe", "build_spec", "hook_command", "HOOK_ENV",
           "common_edits", "hook_work", "edits_to_cdi"]

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
    hook_interpreter: str | None = field(default_factory=lambda: sys.executable)   # None: no hook
    hook_import_path: str = HOOK_IMPORT_PATH

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.device_class}"


class NothingToDescribe(StateError):
    """No device can be described; ``left_out`` says why for each device that was tried."""
    code = "nothing_to_describe"

    def __init__(self, what: str, *, left_out: tuple[HostagentError, ...] = (), **kw):
        super().__init__(what, **kw)
        self.left_out = left_out


@dataclass(frozen=True)
class GeneratedSpec:
    spec: dict | None                       # None: nothing to describe (refresh removed the file)
    problems: tuple[HostagentError, ...]    # devices left out, and why

    @property
    def device_names(self) -> list[str]:
        return [d["name"] for d in self.spec["devices"]] if self.spec else []


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


def prepare_hook(edits: Edits, interpreter: str | None, import_path: str = HOOK_IMPORT_PATH) -> tuple[Hook, ...]:
    """The one hook run a container gets: every link (device links too: the hook makes only
    those whose node the container was given) and the linker cache, in one process. None
    for ``interpreter``: no hook (a simulated node's host that cannot run it)."""
    if interpreter is None:
        return ()
    args = [a for target, link in edits.links for a in ("--link", f"{target}::{link}")]
    args += [a for target, link in edits.device_links for a in ("--device-link", f"{target}::{link}")]
    args += [a for folder in edits.folders for a in ("--folder", folder)]
    return (hook_command(interpreter, "prepare", *args, import_path=import_path),) if args else ()


def edits_to_cdi(edits: Edits, interpreter: str | None, *, import_path: str = HOOK_IMPORT_PATH) -> dict:
    """The spec's top-level ``containerEdits``: ``edits`` and the hook run that makes their
    links and folders."""
    return edits.to_cdi(prepare_hook(edits, interpreter, import_path))


def hook_work(per_device: list[Edits]) -> Edits:
    """What the devices leave to the common hook: their links (by-path links of DRI nodes)."""
    return Edits(links=tuple(lk for e in per_device for lk in e.links),
                 device_links=tuple(lk for e in per_device for lk in e.device_links),
                 folders=tuple(f for e in per_device for f in e.folders))


def common_edits(discovery: Discovery) -> Edits:
    """What every container using any of the node's devices needs, once."""
    return Edits.merge(Edits(env=("NVIDIA_VISIBLE_DEVICES=void",)), discovery.control_nodes(),
                       discovery.libraries(), discovery.binaries(), discovery.ipc(),
                       discovery.firmware(), discovery.config_files())


def describe_devices(inventory: Inventory, discovery: Discovery) -> tuple[list[tuple[object, Edits]], list[HostagentError]]:
    """(device, its edits) for every whole GPU (MIG disabled) and MIG device, and the
    problems of those that cannot be described (each left out, never half described)."""
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
    return per_device, problems


def build_spec(inventory: Inventory, discovery: Discovery, options: SpecOptions = SpecOptions()) -> GeneratedSpec:
    """The node's spec. Raises NothingToDescribe when no device can be described (a spec
    needs at least one), with the reasons."""
    check_kind(options.kind)
    per_device, problems = describe_devices(inventory, discovery)
    devices, described = [], []
    for dev, edits in per_device:
        names = [device_name(dev, s) for s in options.name_strategies]
        bad = [n for n in names if not DEVICE_RE.match(n)]
        if bad:
            problems.append(HostagentError(f"device {bad[0]!r} is left out: not a valid CDI device name",
                                           hint="letters, digits, '_', '.', ':', '-'; alphanumeric first and last"))
            continue
        devices += [{"name": name, "containerEdits": edits.to_cdi()} for name in names]
        described.append(edits)
    if options.all_device and described:
        devices.append({"name": "all", "containerEdits": Edits.merge(*described).to_cdi()})
    if not devices:
        if problems:
            hint = f"{len(problems)} left out, each said above"
        elif inventory.gpus:
            hint = "every GPU has MIG enabled with no MIG devices: create some with 'hostagent mig apply'"
        else:
            hint = "NVML lists no GPU on this node"
        raise NothingToDescribe("there is no GPU or MIG device to describe, and a CDI spec needs at least one",
                                hint=hint, left_out=tuple(problems))

    common = Edits.merge(common_edits(discovery), hook_work(described))
    spec = {"cdiVersion": "", "kind": options.kind, "devices": devices,
            "containerEdits": edits_to_cdi(common, options.hook_interpreter, import_path=options.hook_import_path)}
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
