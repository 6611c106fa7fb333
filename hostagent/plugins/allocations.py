"""What ``Allocate`` does: an allocation in the agent per container's device set, answered as
the kubelet wants it; and the release of the allocations the kubelet no longer holds.

An allocation's id is derived from the resource and the device ids the kubelet gave
(``k8s-device-plugin/<resource>/<hash>``), so a kubelet retry, or the app container that
reuses its init container's devices, gets the same allocation back (the agent answers an
identical request idempotently). The kubelet hands out a device only when no container holds
it any more, so an allocation of this plugin that shares a device id with a new request is
released first. Others are released by ``reconcile``: those no running container holds
according to the kubelet's pod resources API, or, where that API cannot be reached, those
not allocated again for ``expiry`` seconds. A grace period keeps the allocations made in the
last moments: the kubelet records a container's devices only after ``Allocate`` returns.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass

import grpc

from ..errors import ConflictError, HostagentError, NotFoundError, PermissionDenied, UnavailableError, UsageError
from .kubelet import deviceplugin_pb2 as api
from .server import PluginError

__all__ = ["PREFIX", "OWNER", "HOOK_ANNOTATION", "allocation_id", "owned", "kubelet_ids", "container_response", "Allocations"]

log = logging.getLogger("hostagent.plugins")

PREFIX = "k8s-device-plugin/"
OWNER = "hostagent-device-plugin"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# Plain edits carry no hook: the packaged hooks.d entry (hooks/50-hostagent.json) runs
# hostagent's hook for containers annotated so, on engines that read hooks directories.
HOOK_ANNOTATION = ("hostagent.io/hook", "prepare")
LIST_STRATEGIES = ("cdi-cri", "envvar", "edits")
# Where an MPS client gets its daemon's pipe directory and the shared /dev/shm
# (sharing.clients): an answer without the allocation's CDI names carries these mounts.
MPS_MOUNTS = ("/tmp/nvidia-mps", "/dev/shm")


def allocation_id(resource: str, ids) -> str:
    digest = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]
    return f"{PREFIX}{resource}/{digest}"


def owned(alloc_id: str) -> bool:
    return alloc_id.startswith(PREFIX)


def kubelet_ids(alloc: dict) -> frozenset:
    """The device ids the kubelet knows an agent allocation by: the PCI bus ids of GPUs
    passed through to a VM, its replica ids on shared devices (``<uuid>::<n>``), its UUIDs
    elsewhere."""
    if alloc.get("passthrough"):
        return frozenset(rec["gpu"] for rec in alloc["passthrough"])
    replicas = set(alloc.get("replicas") or ())
    shared = {r.rpartition("::")[0] for r in replicas}
    return frozenset(replicas | {u for u in alloc["devices"] if u not in shared})


def grpc_error(e: HostagentError) -> PluginError:
    """An agent error as the gRPC status the kubelet sees."""
    if isinstance(e, UnavailableError):
        code = grpc.StatusCode.UNAVAILABLE
    elif isinstance(e, UsageError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(e, (ConflictError, NotFoundError)):
        code = grpc.StatusCode.FAILED_PRECONDITION
    elif isinstance(e, PermissionDenied):       # the plugin's uid may not (api.plugin_uids)
        code = grpc.StatusCode.PERMISSION_DENIED
    else:
        code = grpc.StatusCode.INTERNAL
    return PluginError(code, f"the agent refused: {e.message}")


def _mps_view(view: dict | None) -> bool:
    """Whether a device's view says MPS shares it."""
    return ((view or {}).get("sharing") or {}).get("strategy") == "mps"


def _node_name(view: dict | None) -> str | None:
    """The device's name in the node's CDI spec, by UUID when it has one (stable across
    index changes)."""
    names = (view or {}).get("cdi_devices") or []
    by_uuid = [n for n in names if n.endswith("=" + view["uuid"])]
    return (by_uuid or names or [None])[0]


def _mps_allocation(alloc: dict) -> bool:
    return (alloc.get("sharing") or {}).get("strategy") == "MPS"


def needs_edits(strategies, mps: bool) -> bool:
    """Whether an answer is made from the allocation's container edits: all of them for the
    edits strategy; an MPS client's part of them when no CDI name carries it."""
    return "edits" in strategies or (mps and "cdi-cri" not in strategies)


def container_response(alloc: dict, views: dict[str, dict], strategies, cdi_names: str):
    """A ``ContainerAllocateResponse`` from an agent allocation. ``cdi_names``: ``node`` (the
    node spec's names, which outlive the allocation) or ``allocation`` (its transient spec,
    always for MPS: only it gives the client its daemon's pipe, /dev/shm and limits). An MPS
    client answered without CDI names gets those as env and mounts, whatever the strategy,
    as NVIDIA's plugin adds them: without them it would run outside MPS."""
    r = api.ContainerAllocateResponse()
    mps = _mps_allocation(alloc)
    if "cdi-cri" in strategies:
        names = alloc["cdi_devices"]
        if cdi_names == "node" and not mps:
            node = [_node_name(views.get(u)) for u in alloc["devices"]]
            names = node if all(node) else names
        r.cdi_devices.extend(api.CDIDevice(name=n) for n in names)
    if "envvar" in strategies:
        r.envs[VISIBLE_DEVICES] = alloc["visible_devices"]
    edits = alloc.get("container_edits") or {}
    if "edits" in strategies:
        _add_env(r, edits.get("env", ()))
        for node in edits.get("deviceNodes", ()):
            r.devices.add(container_path=node["path"], host_path=node.get("hostPath") or node["path"],
                          permissions=node.get("permissions") or "rw")
        _add_mounts(r, edits.get("mounts", ()))
        r.annotations[HOOK_ANNOTATION[0]] = HOOK_ANNOTATION[1]
    elif needs_edits(strategies, mps):
        _add_env(r, [e for e in edits.get("env", ()) if e.startswith("CUDA_MPS_")])
        _add_mounts(r, [m for m in edits.get("mounts", ()) if m["containerPath"] in MPS_MOUNTS])
    return r


def _add_env(r, pairs) -> None:
    for pair in pairs:
        name, _, value = pair.partition("=")
        r.envs[name] = value


def _add_mounts(r, mounts) -> None:
    for m in mounts:
        r.mounts.add(container_path=m["containerPath"], host_path=m["hostPath"],
                     read_only="ro" in (m.get("options") or ()))


@dataclass
class _Entry:
    resource: str
    ids: frozenset
    touched: float            # time.monotonic() of its last Allocate (or its creation)


class Allocations:
    def __init__(self, link, strategies=("cdi-cri", "envvar"), cdi_names: str = "node",
                 grace: float = 60.0, expiry: float = 86400.0):
        self.link = link
        self.strategies = tuple(strategies)
        self.cdi_names = cdi_names
        # The agent writes a transient spec only when its names are answered: a node-spec
        # answer needs nothing but the checkpoint (an MPS client gets its spec regardless).
        self.agent_names = "allocation" if cdi_names == "allocation" and "cdi-cri" in self.strategies else "node"
        self.grace = grace
        self.expiry = expiry
        self._ledger: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    # ---- Allocate -------------------------------------------------------------------

    def allocate(self, resource: str, ids: list[str], physical: dict[str, str]) -> api.ContainerAllocateResponse:
        """``ids``: the kubelet's device ids (checked by the caller); ``physical``: id -> the
        agent's device UUID, in the order the agent should list them (the same for every
        spelling of one request, so a retry is the same request). The agent is asked for the
        ids themselves: UUIDs, and replica ids of shared devices."""
        views = self.link.view.devices
        # The answer's container edits (most of it) only when the response is made from them.
        edits = needs_edits(self.strategies, any(_mps_view(views.get(u)) for u in physical.values()))
        alloc = self._kept(resource, ids, list(physical), edits)
        return container_response(alloc, self.link.view.devices, self.strategies, self.cdi_names)

    def pass_through(self, resource: str, ids: list[str]) -> api.ContainerAllocateResponse:
        """A VM's GPUs (``ids``: PCI bus ids of a resource served to KubeVirt) passed through
        by the agent, answered as NVIDIA's kubevirt-gpu-device-plugin answers."""
        from .kubevirt import vm_response
        return vm_response(self._kept(resource, ids, list(ids), True, vm=True), resource, ids)

    def _kept(self, resource: str, ids: list[str], devices: list[str], edits: bool, vm: bool = False) -> dict:
        """The agent's allocation of the kubelet's ``ids`` (made, or the same one again),
        kept in the ledger; the plugin's allocations in its way released with it."""
        aid = allocation_id(resource, ids)
        labels = {"owner": OWNER, "resource": resource}
        with self._lock:
            in_way = [other for other, entry in self._ledger.items()
                      if other != aid and entry.resource == resource and entry.ids & set(ids)]
            try:
                alloc, replaced = self._create(aid, devices, set(ids), labels, in_way, edits, vm=vm)
            except HostagentError as e:
                raise grpc_error(e) from None
            for other in replaced:
                self._ledger.pop(other, None)
                log.info("released allocation %s: the kubelet allocated its devices again", other)
            self._ledger[aid] = _Entry(resource, frozenset(ids), time.monotonic())
        return alloc

    def _create(self, aid: str, devices: list[str], ids: set, labels: dict, in_way: list[str],
                edits: bool, vm: bool = False) -> tuple[dict, list]:
        """The agent's allocation (``vm``: the devices passed through), and the ids of this
        plugin's allocations in its way that it replaced: released by the same request (one
        commit in the agent), those in the ledger and, when the agent finds more (an earlier
        run's, not in the ledger yet), those too."""
        client = self.link.client()
        replaces = list(in_way)

        def make():
            if vm:        # iommufd's nodes too where the node has them, as KubeVirt's plugin gives
                return client.pass_through(aid, devices, iommufd=True, labels=labels, replaces=replaces)
            return client.allocate(aid, devices, labels=labels, cdi_names=self.agent_names,
                                   replaces=replaces, edits=edits)
        for _ in range(2):
            try:
                return make(), replaces
            except ConflictError as e:
                if e.code == "allocation_conflict":          # an older plugin's request
                    self._release(aid, "made with another request")
                    continue
                if e.code != "device_busy":
                    raise
                more = [a["id"] for a in client.allocations() if owned(a["id"]) and a["id"] != aid
                        and a["id"] not in replaces and kubelet_ids(a) & ids]
                if not more:
                    raise
                replaces += more
        return make(), replaces

    def _release(self, alloc_id: str, why: str) -> None:
        self.link.client().release(alloc_id, missing_ok=True)
        self._ledger.pop(alloc_id, None)
        log.info("released allocation %s: %s", alloc_id, why)

    # ---- releasing what the kubelet no longer holds -------------------------------------

    def load(self) -> None:
        """Take the agent's allocations of this plugin into the ledger (at start, and at each
        reconcile: the agent may have dropped some, an earlier run made others)."""
        allocations = self.link.client().allocations()
        now, wall = time.monotonic(), time.time()
        with self._lock:
            current = {}
            for a in allocations:
                if not owned(a["id"]):
                    continue
                entry = self._ledger.get(a["id"]) or _Entry(
                    (a.get("labels") or {}).get("resource", ""), kubelet_ids(a),
                    now - max(0.0, wall - a.get("created", wall)))
                current[a["id"]] = entry
            self._ledger = current

    def reconcile(self, held: set | None) -> list[str]:
        """Release the allocations past the grace period that no container holds (``held``:
        {(resource, frozenset of ids)} from the pod resources API), or, with ``held`` None,
        those idle longer than ``expiry`` (0: never). Returns the released ids."""
        try:
            self.load()
        except HostagentError as e:
            log.warning("allocations not reconciled: %s", e.message)
            return []
        now = time.monotonic()
        released = []
        with self._lock:
            for aid, e in list(self._ledger.items()):
                idle = now - e.touched
                if idle < self.grace:
                    continue
                if held is not None:
                    if (e.resource, e.ids) in held:
                        continue
                    why = "no running container holds its devices (pod resources API)"
                elif self.expiry and idle >= self.expiry:
                    why = f"not allocated again for {self.expiry:g} s (pod resources API unreachable)"
                else:
                    continue
                try:
                    self._release(aid, why)
                    released.append(aid)
                except HostagentError as err:
                    log.warning("cannot release allocation %s: %s", aid, err.message)
        return released
