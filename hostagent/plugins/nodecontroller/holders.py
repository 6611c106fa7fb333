"""Which pods hold the agent's allocations, so that the pods in the way of a change can be
evicted. Pure: from the node's pods (the API server's) and, for the device plugin's
allocations, what the kubelet says each container holds (its pod resources API).

- The DRA plugin's allocations carry their claim (``labels.claim``, ``namespace/name``): the
  pods holding it are those of that namespace whose ``status.resourceClaimStatuses`` (a
  template's generated claim) or ``spec.resourceClaims`` (a claim by name) name it.
- The device plugin's allocations carry only devices: the pods are those whose containers
  the kubelet reports holding one of those devices (a replica ``<uuid>::<n>`` of one too).
- Anything else (an allocation made through the API by hand) has no pod: it is named as
  such, for its owner to release.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpupods import claim_names

__all__ = ["Holders", "holders"]


@dataclass(frozen=True)
class Holders:
    pods: tuple[tuple[str, str], ...] = ()                        # (namespace, name), sorted
    unheld: tuple[str, ...] = ()                                 # allocation ids no pod holds


def _claim_pods(pods: list[dict], namespace: str, claim: str) -> list[tuple[str, str]]:
    return [(namespace, pod["metadata"]["name"]) for pod in pods if (namespace, claim) in claim_names(pod)]


def _device_pods(holdings, devices: set[str]) -> list[tuple[str, str]]:
    out = []
    for h in holdings or ():
        held = {d.partition("::")[0] for d in h.device_ids}
        if held & devices:
            out.append((h.namespace, h.pod))
    return out


def holders(busy: list[dict], pods: list[dict], holdings=None) -> Holders:
    """The pods holding each of ``busy`` (the agent's ``{id, labels, devices}``); ``holdings``:
    the kubelet's pod resources list (None: not known)."""
    by_allocation: dict[str, tuple] = {}
    for alloc in busy:
        labels = alloc.get("labels") or {}
        found: list[tuple[str, str]] = []
        if "/" in (labels.get("claim") or ""):
            namespace, _, claim = labels["claim"].partition("/")
            found = _claim_pods(pods, namespace, claim)
        elif labels.get("owner") == "hostagent-device-plugin":
            found = _device_pods(holdings, set(alloc.get("devices") or ()))
        by_allocation[alloc["id"]] = tuple(sorted(set(found)))
    return Holders(tuple(sorted({p for found in by_allocation.values() for p in found})),
                   tuple(sorted(a for a, found in by_allocation.items() if not found)))
