"""Label sets of the DCGM-compatible series, computed once per inventory.

dcgm-exporter's order: ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<index>``),
``modelName``, for MIG ``GPU_I_PROFILE`` and ``GPU_I_ID``, ``Hostname``, then label fields
(``DCGM_FI_DRIVER_VERSION``), then attributes (here: the allocation labels the daemon
supplies). A MIG series carries its parent GPU's ``gpu`` and ``UUID``, as DCGM's do.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

__all__ = ["base_labels", "instance_key", "format_labels", "allocation_labels", "merged", "LabelHook"]

# device UUID -> extra labels for its series (e.g. {"allocation": "claim-123"})
LabelHook = Callable[[], Mapping[str, Mapping[str, str]]]


def instance_key(gpu: int, gi: int) -> tuple[int, int]:
    return gpu, gi


def base_labels(inventory, hostname: str) -> dict:
    """GPU index or (GPU index, GI id) -> ordered label pairs."""
    out = {}
    for gpu in inventory.gpus:
        common = [("gpu", str(gpu.index)), ("UUID", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id),
                  ("device", f"nvidia{gpu.index}"), ("modelName", gpu.name)]
        tail = [("Hostname", hostname), ("DCGM_FI_DRIVER_VERSION", inventory.driver_version)]
        out[gpu.index] = tuple(common + tail)
        for gi in (gpu.mig.gpu_instances if gpu.mig_enabled else ()):
            out[instance_key(gpu.index, gi.id)] = tuple(
                common + [("GPU_I_PROFILE", gi.profile), ("GPU_I_ID", str(gi.id))] + tail)
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs) + "}"


def allocation_labels(lookup: Callable[[], Mapping[str, Iterable[str]]],
                      name: str = "allocation") -> LabelHook:
    """A label hook from "device UUID -> allocation ids" (several ids: comma-joined)."""
    def hook():
        return {uuid: {name: ",".join(ids)} for uuid, ids in lookup().items() if ids}
    return hook


def merged(*hooks: LabelHook | None) -> LabelHook | None:
    """One hook giving every hook's labels of each device."""
    hooks = tuple(h for h in hooks if h is not None)
    if len(hooks) < 2:
        return hooks[0] if hooks else None

    def hook():
        out: dict[str, dict[str, str]] = {}
        for h in hooks:
            for uuid, labels in h().items():
                out[uuid] = {**out[uuid], **labels} if uuid in out else labels
        return out
    return hook
