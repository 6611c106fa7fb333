"""The gpu-feature-discovery label set, computed from the inventory (pure).

Keys and value formats follow GFD's: product names sanitised the same way, memory in MiB,
families from the compute capability, and the ``single``/``mixed`` MIG strategies with the
``MIG-INVALID`` case.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ..devices import Gpu, Inventory, MigDevice

__all__ = ["Sharing", "MIG_STRATEGIES", "node_labels", "sanitise", "gpu_family"]

MIG_STRATEGIES = ("none", "single", "mixed")
P = "nvidia.com/"


@dataclass(frozen=True)
class Sharing:
    """How each GPU is shared: ``none``, ``time-slicing`` or ``mps``, with ``replicas``."""
    strategy: str = "none"
    replicas: int = 1
    rename_by_default: bool = False   # shared devices keep their name instead of -SHARED

    @property
    def shared(self) -> bool:
        return self.strategy != "none" and self.replicas > 1


def sanitise(name: str) -> str:
    """GFD's product form: drop characters outside [A-Za-z0-9-_. ], spaces become '-'."""
    return re.sub(r"[^A-Za-z0-9\-_. ]", "", name).strip().replace(" ", "-")


def gpu_family(major: int, minor: int) -> str:
    if major < 2:
        return "tesla"
    if major < 3:
        return "fermi"
    if major < 5:
        return "kepler"
    if major < 6:
        return "maxwell"
    if major < 7:
        return "pascal"
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    if major == 9:
        return "hopper"
    if major in (10, 12):
        return "blackwell"
    if major == 13:
        return "rubin"
    return "undefined"


def _sharing_labels(prefix: str, sharing: Sharing, product: str) -> dict[str, str]:
    shared = sharing.shared
    return {f"{prefix}.product": product + ("-SHARED" if shared and not sharing.rename_by_default else ""),
            f"{prefix}.replicas": str(sharing.replicas if shared else 1),
            f"{prefix}.sharing-strategy": sharing.strategy if shared else "none"}


def _full_gpu_labels(gpus: list[Gpu], sharing: Sharing) -> dict[str, str]:
    first = gpus[0]
    major, minor = (int(x) for x in first.compute_capability.split("."))
    out = _sharing_labels(f"{P}gpu", sharing, sanitise(first.name))
    out.update({f"{P}gpu.count": str(len(gpus)), f"{P}gpu.memory": str(first.memory_mib),
                f"{P}gpu.family": gpu_family(major, minor),
                f"{P}gpu.compute.major": str(major), f"{P}gpu.compute.minor": str(minor)})
    return out


def _mig_labels(prefix: str, model: str, profile: str, devices: list[MigDevice], sharing: Sharing):
    d = devices[0]
    out = _sharing_labels(prefix, sharing, f"{model}-MIG-{profile}")
    out.update({f"{prefix}.count": str(len(devices)), f"{prefix}.memory": str(d.memory_mib),
                f"{prefix}.multiprocessors": str(d.multiprocessors),
                f"{prefix}.slices.gi": str(_gi_slices(profile)), f"{prefix}.slices.ci": str(_ci_slices(profile)),
                f"{prefix}.engines.copy": str(d.copy_engines), f"{prefix}.engines.decoder": str(d.decoders),
                f"{prefix}.engines.encoder": str(d.encoders), f"{prefix}.engines.jpeg": str(d.jpegs),
                f"{prefix}.engines.ofa": str(d.ofas)})
    return out


def _gi_slices(profile: str) -> int:
    return int(re.search(r"(\d+)g\.", profile).group(1))


def _ci_slices(profile: str) -> int:
    m = re.match(r"(\d+)c\.", profile)
    return int(m.group(1)) if m else _gi_slices(profile)


def node_labels(inv: Inventory, *, mig_strategy: str = "none", sharing: Sharing = Sharing(),
                machine: str = "unknown", gpu_mode: str = "compute",
                timestamp: int | None = None) -> dict[str, str]:
    """All labels for the node, as GFD would publish them."""
    if mig_strategy not in MIG_STRATEGIES:
        raise ValueError(f"unknown MIG strategy {mig_strategy!r}")
    gpus = list(inv.gpus)
    if not gpus:
        return {}
    drv = inv.driver_version.split(".")
    cuda_major, _, cuda_minor = inv.cuda_driver_version.partition(".")
    labels = {
        f"{P}cuda.driver.major": drv[0], f"{P}cuda.driver.minor": drv[1] if len(drv) > 1 else "",
        f"{P}cuda.driver.rev": drv[2] if len(drv) > 2 else "",
        f"{P}cuda.driver-version.major": drv[0],
        f"{P}cuda.driver-version.minor": drv[1] if len(drv) > 1 else "",
        f"{P}cuda.driver-version.revision": drv[2] if len(drv) > 2 else "",
        f"{P}cuda.driver-version.full": inv.driver_version,
        f"{P}cuda.runtime.major": cuda_major, f"{P}cuda.runtime.minor": cuda_minor,
        f"{P}cuda.runtime-version.major": cuda_major, f"{P}cuda.runtime-version.minor": cuda_minor,
        f"{P}cuda.runtime-version.full": inv.cuda_driver_version,
        f"{P}gpu.machine": sanitise(machine) or "unknown",
        f"{P}gpu.mode": gpu_mode,
        f"{P}mig.capable": str(any(g.mig_capable for g in gpus)).lower(),
        f"{P}mps.capable": str(sharing.strategy == "mps" and not any(g.mig_enabled for g in gpus)).lower(),
        f"{P}vgpu.present": "false",
    }
    if timestamp is not None:
        labels[f"{P}gfd.timestamp"] = str(timestamp)
    if mig_strategy != "none":
        labels[f"{P}mig.strategy"] = mig_strategy

    full = [g for g in gpus if not g.mig_enabled]
    migs = [g for g in gpus if g.mig_enabled]
    if mig_strategy == "none":
        labels.update(_full_gpu_labels(gpus, sharing))
        if migs and not full:                # MIG-enabled GPUs are not handed out whole
            labels[f"{P}gpu.replicas"] = "0"
    elif mig_strategy == "single":
        labels.update(_full_gpu_labels(gpus, sharing))
        labels.update(_single(gpus, full, migs, sharing))
    else:
        labels.update(_full_gpu_labels(full or gpus, sharing))
        if not full:
            labels[f"{P}gpu.count"] = "0"
        by_profile: dict[str, list[MigDevice]] = {}
        for g in migs:
            for d in g.mig.devices:
                by_profile.setdefault(d.profile, []).append(d)
        model = sanitise(gpus[0].name)
        for profile, devices in sorted(by_profile.items()):
            parent = next(g for g in migs if g.index == devices[0].parent_index)
            labels.update(_mig_labels(f"{P}mig-{profile}", sanitise(parent.name) or model, profile, devices, sharing))
    return labels


def _single(gpus, full, migs, sharing) -> dict[str, str]:
    """Every GPU MIG-enabled with one profile throughout, or the MIG-INVALID labels."""
    profiles = Counter(d.profile for g in migs for d in g.mig.devices)
    model = sanitise(gpus[0].name)
    if not migs:
        return {}
    if full or len(profiles) != 1 or any(not g.mig.devices for g in migs):
        return {f"{P}gpu.product": f"{model}-MIG-INVALID", f"{P}gpu.count": "0",
                f"{P}gpu.replicas": "0", f"{P}gpu.sharing-strategy": "", f"{P}gpu.memory": "0"}
    profile = next(iter(profiles))
    devices = [d for g in migs for d in g.mig.devices]
    return _mig_labels(f"{P}gpu", model, profile, devices, sharing)
