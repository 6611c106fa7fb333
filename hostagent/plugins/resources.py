"""Which Kubernetes resources a node's devices make, pure: the agent's device views and a MIG
strategy in, ``{resource name: devices}`` out, as the NVIDIA device plugin names them.

- ``none``: every GPU without MIG is ``nvidia.com/gpu`` (a GPU with MIG enabled is left
  out: the agent allocates only its MIG devices, and a container could not use it whole).
- ``single``: MIG devices are ``nvidia.com/gpu`` when every GPU has MIG enabled, each has
  MIG devices and all are of one profile; GPUs without MIG are ``nvidia.com/gpu`` when none
  has it enabled. Anything else is the device plugin's invalid case: no devices, and a
  problem that says why.
- ``mixed``: GPUs without MIG are ``nvidia.com/gpu``; MIG devices are
  ``nvidia.com/mig-<profile>``, a ``+`` in the profile spelled ``.`` (``mig-1g.10gb.me``).

A device the agent shares (MPS or time-slicing, ``GET /v1/sharing``) is advertised as its
replicas (``<uuid>::<n>``, the device view's ``replicas``), under the resource's ``rename``
when the sharing configuration gives one (``renameByDefault``: ``<name>.shared``).

A device is Healthy when the agent is reachable, its health is not ``unhealthy``, the node's
CDI spec describes it, its MPS control daemon (if it is shared with MPS) is ready, and no
allocation made outside this plugin holds it (the kubelet would hand out a device the agent
refuses).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import model

__all__ = ["PluginDevice", "STRATEGIES", "GPU_RESOURCE", "mig_resource", "node_resources",
           "strategy_from_labels"]

STRATEGIES = ("none", "single", "mixed")
GPU_RESOURCE = "nvidia.com/gpu"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


@dataclass(frozen=True)
class PluginDevice:
    id: str                  # the id the kubelet knows: the UUID, or a replica's <uuid>::<n>
    uuid: str                # the agent's device
    health: str              # HEALTHY or UNHEALTHY
    numa: int | None         # NUMA node of the device (a MIG device: its GPU's)
    why: str | None = None   # why it is unhealthy


def mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile.replace('+', '.')}"


def strategy_from_labels(labels: dict) -> str:
    """The MIG strategy the agent labels the node with (``labels.mig_strategy``)."""
    value = labels.get("nvidia.com/mig.strategy", "none")
    return value if value in STRATEGIES else "none"


def _health(view: dict, connected: bool, owned) -> tuple[str, str | None]:
    if not connected:
        return UNHEALTHY, "the agent is not reachable"
    health = view.get("health") or {}
    if health.get("state") == "unhealthy":
        return UNHEALTHY, health.get("message") or "unhealthy"
    if not view.get("cdi_devices"):
        return UNHEALTHY, "not in the node's CDI spec"
    daemon = ((view.get("sharing") or {}).get("mps") or {}).get("state")
    if daemon not in (None, "ready"):
        return UNHEALTHY, f"its MPS control daemon is {daemon}"
    foreign = [a for a in view.get("allocations", ()) if not owned(a)]
    if foreign:
        return UNHEALTHY, f"allocated outside Kubernetes: {', '.join(foreign)}"
    return HEALTHY, None


def node_resources(devices: dict[str, dict], strategy: str, connected: bool = True,
                   owned=lambda alloc_id: False) -> tuple[dict[str, list[PluginDevice]], list[str]]:
    """({resource: devices in index order}, problems). ``devices``: uuid -> device view;
    ``owned(allocation id)``: whether this plugin made that allocation."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown MIG strategy {strategy!r}")
    gpus = sorted((d for d in devices.values() if d["kind"] == "gpu"), key=lambda d: d["index"])
    migs = sorted((d for d in devices.values() if d["kind"] == "mig"),
                  key=lambda d: (d["parent_index"], d["index"]))
    mig_enabled = [g for g in gpus if model.mig_enabled(g)]
    whole = [g for g in gpus if g not in mig_enabled]

    out: dict[str, list[PluginDevice]] = {}

    def add(resource: str, view: dict) -> None:
        parent = devices.get(view.get("parent_uuid") or "", view)
        health, why = _health(view, connected, owned)
        shared = view.get("sharing") or {}
        # An agent without sharing lists no replicas: the device is its only one.
        for ident in view.get("replicas") or [view["uuid"]]:
            out.setdefault(shared.get("rename") or resource, []).append(
                PluginDevice(ident, view["uuid"], health, parent.get("numa_node"), why))

    problems: list[str] = []
    if strategy == "none" or strategy == "mixed":
        for g in whole:
            add(GPU_RESOURCE, g)
        if strategy == "mixed":
            for m in migs:
                add(mig_resource(m["profile"]), m)
        empty = [str(g["index"]) for g in mig_enabled if not g["mig"].get("devices")]
        if strategy == "mixed" and empty:
            problems.append(f"GPU(s) {', '.join(empty)} have MIG enabled but no MIG devices")
        if strategy == "none" and mig_enabled:
            problems.append(f"GPU(s) {', '.join(str(g['index']) for g in mig_enabled)} have MIG "
                            "enabled: left out under the none strategy (use single or mixed)")
        return out, problems
    # single
    if mig_enabled and whole:
        problems.append("the single strategy needs every GPU alike: GPU(s) "
                        f"{', '.join(str(g['index']) for g in whole)} have MIG disabled, "
                        f"{', '.join(str(g['index']) for g in mig_enabled)} enabled")
    empty = [str(g["index"]) for g in mig_enabled if not g["mig"].get("devices")]
    if empty:
        problems.append(f"the single strategy needs MIG devices on every MIG-enabled GPU: "
                        f"GPU(s) {', '.join(empty)} have none")
    profiles = sorted({m["profile"] for m in migs})
    if len(profiles) > 1:
        problems.append(f"the single strategy needs one MIG profile, the node has {', '.join(profiles)}")
    if problems:
        return {}, problems
    for d in (migs if mig_enabled else whole):
        add(GPU_RESOURCE, d)
    return out, problems
