"""The bundled default config, generated from the GPUs present (as mig-parted's
``generate-config`` does, from NVML, so new SKUs need no table update):

- ``all-disabled``, ``all-enabled`` (MIG on, no instances);
- ``all-<profile>`` for every GPU-instance profile, with as many instances as the profile
  allows (``+`` becomes ``.`` in the name: ``all-1g.5gb.me``; ``-me`` is kept);
- ``all-balanced``: two 1g, one 2g and one 3g instance on 7-slice GPUs, two 1g and one 2g
  on 4-slice GPUs, each the attribute-free profile of that size with the most instances
  (A100-40GB: 2x 1g.5gb + 2g.10gb + 3g.20gb; A30: 2x 1g.6gb + 2g.12gb), checked with the
  solver and left out for a SKU where it would not fit.

On a node with more than one kind of GPU every entry carries a ``device-filter`` for its
SKU, so a profile name is only ever applied to GPUs that have it.
"""

from __future__ import annotations

from ..devices.records import Gpu, Inventory
from .quirks import mig_profiles
from .solver import Geometry, Infeasible, solve
from .spec import ConfigEntry, DeviceFilter, MigSpec

__all__ = ["default_spec", "balanced_layout"]

_BALANCED = {7: {1: 2, 2: 1, 3: 1}, 4: {1: 2, 2: 1}}


def balanced_layout(gpu: Gpu) -> dict[str, int] | None:
    profiles = mig_profiles(gpu)
    if not profiles:                 # listed only while MIG is enabled on this driver
        return None
    geo = Geometry.of(profiles)
    shape = _BALANCED.get(geo.compute_slices)
    if shape is None:
        return None
    chosen = {}
    for g, count in shape.items():
        plain = [p for p in profiles if p.slices == g and not any(c in p.name for c in "+-")]
        if not plain:
            return None
        best = max(plain, key=lambda p: (p.instances, -p.memory_mib))
        chosen[best] = count
    try:
        solve(geo, {p.id: [p.slices] * n for p, n in chosen.items()})
    except Infeasible:
        return None
    return {p.name: n for p, n in chosen.items()}


def _config_name(profile: str) -> str:
    return "all-" + profile.replace("+", ".")


def default_spec(inventory: Inventory) -> MigSpec:
    mig_gpus = [g for g in inventory.gpus if g.mig is not None]
    skus: dict[int, Gpu] = {}
    for g in mig_gpus:                 # per SKU, a GPU that lists its profiles if any does
        if g.pci_device_id not in skus or (g.mig.profiles and not skus[g.pci_device_id].mig.profiles):
            skus[g.pci_device_id] = g
    mixed = len(skus) > 1 or len(mig_gpus) != len(inventory.gpus)

    def entries(per_sku) -> tuple[ConfigEntry, ...]:
        out = []
        for device_id, gpu in skus.items():
            entry = per_sku(gpu)
            if entry is None:
                continue
            enabled, devices = entry
            out.append(ConfigEntry("all", enabled, tuple(devices.items()),
                                   (DeviceFilter(device_id),) if mixed else ()))
        return tuple(out)

    configs: dict[str, tuple[ConfigEntry, ...]] = {
        "all-disabled": (ConfigEntry("all", False),),
    }
    if skus:
        configs["all-enabled"] = entries(lambda gpu: (True, {}))
    names = []
    for gpu in skus.values():
        names += [p.name for p in gpu.mig.profiles if p.name not in names]
    for name in names:
        def one(gpu, name=name):
            prof = next((p for p in mig_profiles(gpu) if p.name == name), None)
            return (True, {name: prof.instances}) if prof else None
        configs[_config_name(name)] = entries(one)
    balanced = entries(lambda gpu: (True, b) if (b := balanced_layout(gpu)) else None)
    if balanced:
        configs["all-balanced"] = balanced
    return MigSpec(configs, "<bundled default>")
