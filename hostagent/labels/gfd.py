"""The gpu-feature-discovery label set, computed from the inventory (pure).

Keys and value formats follow GFD's (``internal/lm``): product names sanitised the same
way, memory in MiB, families from the compute capability, MIG profile names with ``+``
spelled ``.``, and the ``single``/``mixed`` MIG strategies with the ``MIG-INVALID`` case.

The ``nvidia.com/gpu.*`` labels are GFD's full-GPU labelers: one per GPU model, counting
every GPU of that model (counts are never added across models). MIG-enabled GPUs are
labelled without sharing (``replicas=0``, plain product, ``none``); models with GPUs not
MIG-enabled are labelled with the sharing settings and override them. On a node with more
than one model GFD lets one model's labels win at random (Go map order); here the model of
the lowest-indexed GPU of the overriding group wins, so labels do not flap between runs.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ..devices import Gpu, Inventory, MigDevice

__all__ = ["Sharing", "MIG_STRATEGIES", "node_labels", "sanitise", "gpu_family", "mig_name",
           "TIMESTAMP"]

MIG_STRATEGIES = ("none", "single", "mixed")
P = "nvidia.com/"
TIMESTAMP = P + "gfd.timestamp"


@dataclass(frozen=True)
class Sharing:
    """How devices are shared: ``none``, ``time-slicing`` or ``mps``, with ``replicas``;
    as a device plugin config that replicates every resource it names (``nvidia.com/gpu``,
    and each ``nvidia.com/mig-<profile>`` under the mixed strategy)."""
    strategy: str = "none"
    replicas: int = 1
    rename_by_default: bool = False   # shared devices keep their name instead of -SHARED

    @property
    def shared(self) -> bool:
        return self.strategy != "none" and self.replicas > 1


def sanitise(name: str) -> str:
    """GFD's product form: drop characters outside [A-Za-z0-9-_. ], runs of spaces become '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def mig_name(profile: str) -> str:
    """A MIG profile as GFD names its resource: ``1g.5gb+me`` is ``1g.5gb.me`` (a '+' is
    not allowed in label keys nor values)."""
    return profile.replace("+", ".")


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


def _resource_labels(prefix: str, count: int, parts: list[str], sharing: Sharing | None) -> dict[str, str]:
    """GFD's base labels of a resource. ``sharing`` None: labelled without sharing, as GFD
    labels MIG-enabled GPUs (replicas 0)."""
    shared = sharing is not None and sharing.shared
    replicas = 0 if sharing is None else sharing.replicas if shared else 1
    product = "-".join(sanitise(p) for p in parts if p)
    if shared and not sharing.rename_by_default:
        product += "-SHARED"
    return {f"{prefix}.product": product, f"{prefix}.count": str(count),
            f"{prefix}.replicas": str(replicas),
            f"{prefix}.sharing-strategy": sharing.strategy if shared else "none"}


def _gpu_labels(gpu: Gpu, count: int, sharing: Sharing | None) -> dict[str, str]:
    out = _resource_labels(f"{P}gpu", count, [gpu.name], sharing)
    if gpu.memory_mib:
        out[f"{P}gpu.memory"] = str(gpu.memory_mib)
    major, minor = (int(x) for x in gpu.compute_capability.split("."))
    if major:
        out.update({f"{P}gpu.family": gpu_family(major, minor),
                    f"{P}gpu.compute.major": str(major), f"{P}gpu.compute.minor": str(minor)})
    return out


def _sharing_of(devices, sharing: Sharing, device_sharing: dict | None) -> Sharing:
    """How a resource's devices are shared: the node-wide setting, or, from the devices'
    own sharing (``device_sharing``: uuid -> Sharing, the configuration in force), the
    strategy of the first shared device and the fewest replicas any device of it offers."""
    if device_sharing is None:
        return sharing
    shared = [device_sharing[d.uuid] for d in devices if d.uuid in device_sharing and device_sharing[d.uuid].shared]
    if not shared:
        return Sharing()
    first = shared[0]
    return Sharing(first.strategy, min(s.replicas for s in shared if s.strategy == first.strategy),
                   first.rename_by_default)


def _full_gpu_labels(gpus: list[Gpu], sharing: Sharing, device_sharing: dict | None = None) -> dict[str, str]:
    """GFD's newGPULabelers: MIG-enabled models first (without sharing), then the models
    of GPUs not MIG-enabled (with it), each overriding the keys before it."""
    counts = Counter(g.name for g in gpus)
    labels: dict[str, str] = {}
    for shareable, members in ((False, [g for g in gpus if g.mig_enabled]),
                               (True, [g for g in gpus if not g.mig_enabled])):
        first_of_model: dict[str, Gpu] = {}
        for g in members:
            first_of_model.setdefault(g.name, g)
        for g in reversed(first_of_model.values()):       # the lowest-indexed model last: it wins
            group = _sharing_of([m for m in members if m.name == g.name], sharing, device_sharing) \
                if shareable else None
            labels.update(_gpu_labels(g, counts[g.name], group))
    return labels


def _mig_labels(prefix: str, model: str, profile: str, devices: list[MigDevice], sharing: Sharing):
    d = devices[0]
    out = _resource_labels(prefix, len(devices), [model, "MIG", mig_name(profile)], sharing)
    out.update({f"{prefix}.memory": str(d.memory_mib),
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
                timestamp: int | None = None, device_sharing: dict | None = None) -> dict[str, str]:
    """All labels for the node, as GFD would publish them. ``device_sharing`` (uuid ->
    Sharing): the sharing in force, device by device, which then decides the sharing labels
    instead of ``sharing``; ``mps.capable`` then says whether any device is shared with MPS
    (MIG devices included: hostagent runs MPS on them, which GFD's rule did not foresee)."""
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
        f"{P}mps.capable": str(any(s.strategy == "mps" for s in device_sharing.values()) if device_sharing is not None
                               else sharing.strategy == "mps" and not any(g.mig_enabled for g in gpus)).lower(),
    }
    # No nvidia.com/vgpu.*: GFD's vgpu labeler emits vgpu.present (=true, with the host
    # driver's version and branch) only when vGPU devices exist, and nothing otherwise (its
    # expected-output files list vgpu.* for vGPU nodes only). The reference catalog's
    # "false" is an example value; emitting it would break selectors that test for the key's
    # absence, and hostagent does not run on vGPU guests' hosts.
    if timestamp is not None:
        labels[TIMESTAMP] = str(timestamp)
    labels.update(_full_gpu_labels(gpus, sharing, device_sharing))
    if mig_strategy == "none":
        return labels
    labels[f"{P}mig.strategy"] = mig_strategy
    migs = [g for g in gpus if g.mig_enabled]
    if mig_strategy == "single":
        labels.update(_single(gpus, migs, _sharing_of([d for g in migs for d in g.mig.devices], sharing,
                                                      device_sharing)))
        return labels
    by_profile: dict[str, list[MigDevice]] = {}
    for g in migs:
        for d in g.mig.devices:
            by_profile.setdefault(mig_name(d.profile), []).append(d)
    for name, devices in sorted(by_profile.items()):
        parent = next(g for g in migs if g.index == devices[0].parent_index)
        labels.update(_mig_labels(f"{P}mig-{name}", parent.name, devices[0].profile, devices,
                                  _sharing_of(devices, sharing, device_sharing)))
    return labels


def _single(gpus, migs, sharing) -> dict[str, str]:
    """Every GPU MIG-enabled with one profile throughout, or the MIG-INVALID labels (which
    leave the full-GPU labeler's family and compute capability)."""
    if not migs:
        return {}                              # as the none strategy
    profiles = Counter(mig_name(d.profile) for g in migs for d in g.mig.devices)
    if len(migs) != len(gpus) or len(profiles) != 1 or any(not g.mig.devices for g in migs):
        return {f"{P}gpu.product": f"{sanitise(migs[0].name)}-MIG-INVALID", f"{P}gpu.count": "0",
                f"{P}gpu.replicas": "0", f"{P}gpu.sharing-strategy": "", f"{P}gpu.memory": "0"}
    devices = [d for g in migs for d in g.mig.devices]
    return _mig_labels(f"{P}gpu", migs[0].name, devices[0].profile, devices, sharing)
