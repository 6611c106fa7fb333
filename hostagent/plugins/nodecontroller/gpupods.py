"""Which pods of a node a driver upgrade moves off it, pure (the GPU operator's choice,
``gpuPodSpecFilter``): pods running or pending whose containers request an ``nvidia.com/*``
resource, or that hold a ResourceClaim allocated by the DRA driver ``gpu.nvidia.com``
(not for admin access; a claim that cannot be read counts as one). DaemonSet pods stay:
their controller would start them again on the cordoned node. So do mirror pods (a static
pod's, which the kubelet owns) and pods without GPUs.
"""

from __future__ import annotations

__all__ = ["DRA_DRIVER", "claim_names", "candidates", "gpu_pods"]

DRA_DRIVER = "gpu.nvidia.com"
MIRROR = "kubernetes.io/config.mirror"


def _meta(pod: dict) -> dict:
    return pod.get("metadata") or {}


def _key(pod: dict) -> tuple[str, str]:
    return _meta(pod).get("namespace", ""), _meta(pod)["name"]


def _stays(pod: dict) -> bool:
    if (pod.get("status") or {}).get("phase") not in ("Running", "Pending"):
        return True
    if MIRROR in (_meta(pod).get("annotations") or {}):
        return True
    return any(o.get("kind") == "DaemonSet" for o in _meta(pod).get("ownerReferences") or ())


def _requests_gpu(pod: dict) -> bool:
    spec = pod.get("spec") or {}
    for container in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ())):
        resources = container.get("resources") or {}
        for amounts in (resources.get("requests") or {}, resources.get("limits") or {}):
            if any(name.startswith("nvidia.com/") for name in amounts):
                return True
    return False


def claim_names(pod: dict) -> list[tuple[str, str]]:
    """The pod's ResourceClaims: by name, and those generated from its templates."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    names = {c.get("resourceClaimName") for c in spec.get("resourceClaims") or ()}
    names |= {c.get("resourceClaimName") for c in status.get("resourceClaimStatuses") or ()}
    namespace = _meta(pod).get("namespace", "")
    return sorted((namespace, n) for n in names if n)


def _gpu_claim(claim: dict | None) -> bool:
    if claim is None:                        # unreadable: taken for one, as the GPU operator does
        return True
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    return any(r.get("driver") == DRA_DRIVER and not r.get("adminAccess") for r in results)


def candidates(pods: list[dict]) -> list[dict]:
    """The pods whose GPUs are worth a look: not DaemonSet, mirror, finished pods."""
    return [p for p in pods if not _stays(p)]


def gpu_pods(pods: list[dict], claims: dict) -> list[tuple[str, str]]:
    """(namespace, name) of the pods to evict, sorted; ``claims``: (namespace, name) -> the
    ResourceClaim, or None when it could not be read (claims not asked for are not GPU
    claims of this node)."""
    out = []
    for pod in candidates(pods):
        if _requests_gpu(pod) or any(_gpu_claim(claims.get(c, {})) for c in claim_names(pod)):
            out.append(_key(pod))
    return sorted(out)
