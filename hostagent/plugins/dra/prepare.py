"""NodePrepareResources and NodeUnprepareResources: one agent allocation per claim.

Preparing a claim reads the ResourceClaim from the API server (by namespace and name, its
uid checked: a claim deleted and made again is another claim), takes this driver's results
and their configuration (``claims``), and asks the agent for the allocation
``k8s-dra/<claim uid>``: the published devices, shared as configured, with a transient CDI
spec of their own whose names the answer gives per device. The agent's answer to the same
request is the same allocation, so a kubelet retry, or one after a plugin or agent restart,
gets the same devices and names; the agent's checkpoint is the only record. An allocation is
made whole or not at all, so a claim that fails leaves nothing behind.

Unpreparing releases the allocation; an unknown one (already released, never made) is done.
"""

from __future__ import annotations

import logging

from ...errors import HostagentError
from .claims import ClaimError, claim_results
from .errors import KubeError
from .service import Prepared, PreparedDevice
from .vfioconfig import passthrough_item

__all__ = ["Preparer", "PREFIX", "OWNER", "allocation_id", "owned"]

log = logging.getLogger("hostagent.plugins")

PREFIX = "k8s-dra/"
OWNER = "hostagent-dra-plugin"
EXCLUSIVE = {"strategy": "Exclusive"}


def allocation_id(claim_uid: str) -> str:
    return f"{PREFIX}{claim_uid}"


def owned(alloc_id: str) -> bool:
    return alloc_id.startswith(PREFIX)


class Preparer:
    def __init__(self, link, api, driver: str, pool_name: str, pool):
        """``pool()``: the devices published now (a ``devices.Pool``), None before the
        agent's devices are known."""
        self.link = link
        self.api = api
        self.driver = driver
        self.pool_name = pool_name
        self.pool = pool

    # ---- prepare ----------------------------------------------------------------------

    def prepare(self, claims) -> dict[str, Prepared]:
        out = {}
        for claim in claims:
            try:
                out[claim.uid] = self._prepare(claim)
            except (ClaimError, HostagentError) as e:
                message = e.message if isinstance(e, HostagentError) else str(e)
                log.warning("claim %s (%s) not prepared: %s", claim, claim.uid, message)
                out[claim.uid] = Prepared(error=f"claim {claim}: {message}")
            except KubeError:
                raise                       # the API server, not the claim: the kubelet's call fails
            except Exception as e:          # a claim this code did not foresee: its own error, not the call's
                log.exception("claim %s (%s) not prepared", claim, claim.uid)
                out[claim.uid] = Prepared(error=f"claim {claim}: cannot be prepared ({type(e).__name__}: {e})")
        return out

    def _claim(self, claim) -> dict:
        try:
            obj = self.api.get_claim(claim.namespace, claim.name)
        except KubeError as e:
            if e.status == 404:
                raise ClaimError(f"ResourceClaim {claim} does not exist") from None
            raise
        except ValueError as e:         # the claim does not decode as a ResourceClaim: its message names where
            raise ClaimError(f"ResourceClaim {claim} cannot be read: {e}") from None
        uid = (obj.get("metadata") or {}).get("uid")
        if uid != claim.uid:
            raise ClaimError(f"ResourceClaim {claim} has uid {uid}, not {claim.uid} (deleted and made again?)")
        return obj

    def _prepare(self, claim) -> Prepared:
        obj = self._claim(claim)
        pool = self.pool()
        if pool is None:
            raise ClaimError("the node's devices are not known yet (is the hostagent daemon running?)")
        results = claim_results(obj, self.driver, self.pool_name, pool.by_name)
        names = [r.device.name for r in results]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ClaimError(f"device {twice[0]} is allocated twice in one claim")
        # Each device shared as its configuration says (gpu-test5: one time-sliced, one MPS); a
        # vfio device passed through as its VfioDeviceConfig says.
        items = [passthrough_item(r.device.allocate, r.sharing) if r.device.kind == "vfio" else
                 r.device.allocate if r.sharing == EXCLUSIVE else {**r.device.allocate, "sharing": r.sharing}
                 for r in results]
        mps = any(r.sharing.get("strategy") == "MPS" for r in results)
        # The node spec's names where they are all a container needs (they outlive the
        # allocation and cost no spec of its own); an MPS client's own spec gives it its daemon.
        alloc = self.link.client().allocate(
            allocation_id(claim.uid), items, labels={"owner": OWNER, "claim": str(claim), "claim_uid": claim.uid},
            cdi_names="allocation" if mps else "node", edits=False, own_mps_daemon=mps)
        cdi = alloc["cdi_devices"]
        log.info("claim %s (%s) prepared: %s", claim, claim.uid, ", ".join(names))
        return Prepared(tuple(PreparedDevice((r.request,), self.pool_name, r.device.name, (cdi[i],))
                              for i, r in enumerate(results)))

    # ---- unprepare --------------------------------------------------------------------

    def unprepare(self, claims) -> dict[str, str | None]:
        out = {}
        for claim in claims:
            try:
                released = self.link.client().release(allocation_id(claim.uid), missing_ok=True)
                out[claim.uid] = None
                if released is not None:
                    log.info("claim %s (%s) unprepared", claim, claim.uid)
            except HostagentError as e:
                log.warning("claim %s (%s) not unprepared: %s", claim, claim.uid, e.message)
                out[claim.uid] = f"claim {claim}: {e.message}"
        return out
