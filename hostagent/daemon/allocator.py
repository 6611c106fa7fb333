"""Allocations, imperative: pick devices with the pure rules, write the transient spec, then
the checkpoint (the commit point); release in the reverse order; restore at start.

The blocking parts run under the node lock on the agent's worker thread (a commit that
writes only the checkpoint on the event loop, ``Agent.commit``); the agent's state
changes, and the events, happen on the event loop's thread afterwards, so a crash or a
failed write never leaves memory ahead of the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time

from ..cdi import transient
from ..errors import HostagentError, UnknownName
from ..lock import node_lock
from . import allocations as alloc_rules
from .. import faults
from . import checkpoint, claimmps, madedevices, timeslices
from .events import Rendered
from .views import allocation_json

__all__ = ["Allocator"]

log = logging.getLogger("hostagent.daemon")


@contextlib.contextmanager
def _unwritable(what: str, where):
    """A write of the node's state the file system refused (no space, a read-only or failing
    disk) is the caller's clear 503, with nothing changed: the commit's own undo has run."""
    try:
        yield
    except OSError as e:
        from ..errors import UnavailableError
        reason = e.strerror or str(e)
        raise UnavailableError(f"cannot {what}: {reason}" + (f" ({e.filename})" if e.filename else ""),
                               where=str(where), errno=e.errno,
                               hint="nothing was changed; free space on that file system (or fix what the error "
                                    "names), then try again") from None


def _refuse_others(allocs, uid: int) -> None:
    """403 when ``uid`` may not change one of ``allocs`` (not its owner, not root)."""
    theirs = [a for a in allocs if not a.may_change(uid)]
    if theirs:
        names = ", ".join(f"{a.id!r} (uid {a.owner})" for a in theirs[:5]) + (" ..." if len(theirs) > 5 else "")
        raise alloc_rules.NotOwner(f"allocation(s) {names} belong to another caller: only their owner or root "
                                   f"may release or replace them", ids=[a.id for a in theirs], uid=uid,
                                   hint="release your own allocations; root may release any")


class Allocator:
    def __init__(self, agent):
        self.agent = agent
        self.host = agent.host
        self._files = None      # (node spec, Discovery, common edits): _driver_files()
        self._node_edits: dict = {}   # (devices, hook home) -> plain edits, for the node spec in force
        self.undone_at_start = False  # restore destroyed MIG devices of an interrupted allocation
        self.timeslices = timeslices.TimeSlices(agent.host)

    def _same_request(self, existing: dict, request: dict) -> bool:
        """The same request, devices named by index, UUID, MIG or CDI name alike: a plugin
        retrying with another spelling of the same devices gets its allocation back."""
        if existing == request:
            return True
        lookup = self.agent.snapshot.lookup

        def resolved(r):
            return {**r, "devices": [{"device": lookup.get(d["device"], d["device"])} if "device" in d else d
                                     for d in r["devices"]]}
        return resolved(existing) == resolved(request)

    def _candidates(self) -> list[alloc_rules.Candidate]:
        out = []
        inv = self.agent.inventory
        if inv is None:
            return out
        shared = self.agent.sharing.devices()

        held = checkpoint.held_devices(self.agent.checkpoint_damage) if self.agent.checkpoint_damage else frozenset()

        def why_not(uuid: str) -> str | None:
            if not self.agent.cdi_names.get(uuid):
                return "not in the CDI spec"
            if held is None or uuid in held:
                return ("an allocation record the checkpoint could not read may hold it (GET /v1/node: checkpoint; "
                        "an admin dismisses such records with hostagent allocations dismiss-unreadable)")
            daemon = (shared.get(uuid) or {}).get("mps")
            if daemon is not None and daemon["state"] != "ready":
                return f"its MPS control daemon is {daemon['state']}" + (f" ({daemon['reason']})" if daemon["reason"] else "")
            return None
        for gpu in inv.gpus:
            why = "MIG is enabled: allocate its MIG devices" if gpu.mig_enabled else None
            out.append(alloc_rules.Candidate(
                gpu.uuid, str(gpu.index), "gpu", gpu.name, gpu.memory_mib, gpu.compute_capability,
                None, (gpu.index, -1), why or why_not(gpu.uuid), shared.get(gpu.uuid)))
            for d in (gpu.mig.devices if gpu.mig else ()):
                out.append(alloc_rules.Candidate(
                    d.uuid, d.name, "mig", gpu.name, d.memory_mib, gpu.compute_capability, d.profile,
                    (gpu.index, d.index), why_not(d.uuid), shared.get(d.uuid)))
        return out

    def _taken(self, leaving=frozenset()) -> dict[str, set[str]]:
        """uuid -> the replica ids the allocations (but those ``leaving``) hold on it."""
        out: dict[str, set[str]] = {}
        for a in self.agent.allocations.values():
            if a.id in leaving:
                continue
            for r in a.replicas:
                replica = alloc_rules.replica_of(r)
                out.setdefault(replica[0] if replica else r, set()).add(r)
        return out

    def _records(self, uuids) -> list:
        by_uuid = {}
        for gpu in self.agent.inventory.gpus:
            by_uuid[gpu.uuid] = gpu
            for d in (gpu.mig.devices if gpu.mig else ()):
                by_uuid[d.uuid] = d
        return [by_uuid[u] for u in uuids]

    def _driver_files(self):
        """Worker: (Discovery, common edits) for the node spec in force. The driver's files
        (libraries, binaries, config files: most of an allocation's cost when found afresh)
        are found once per node spec generation, so an allocation describes the driver the
        node spec does; a refresh (resync, MIG change, driver install) finds them again."""
        from ..cdi.discover import Discovery
        from ..cdi.spec import common_edits
        spec = self.agent.spec
        if self._files is None or self._files[0] is not spec:
            discovery = Discovery(self.host, self.agent.inventory.driver_version)
            self._files = (spec, discovery, common_edits(discovery))
            self._node_edits = {}
        return self._files[1], self._files[2]

    def _node_names(self, alloc: alloc_rules.Allocation) -> tuple[str, ...]:
        """The devices' names in the node spec, by UUID where it has them (stable across
        index changes)."""
        out = []
        for uuid in alloc.devices:
            names = self.agent.cdi_names.get(uuid) or ()
            out.append(next((n for n in names if n.endswith("=" + uuid)), names[0] if names else uuid))
        return tuple(out)

    def _prepare(self, alloc: alloc_rules.Allocation, records) -> alloc_rules.Allocation:
        """Worker: the allocation's container edits, and its transient spec written when it
        has one of its own; returns the allocation with the derived fields filled in.

        The spec is written atomically but not fsynced: it lives in /run (a tmpfs, gone at a
        reboot) and the daemon's start rewrites the spec of every allocation it keeps from
        the checkpoint, so durability would buy nothing; the checkpoint is the durable
        record."""
        import dataclasses
        from ..cdi.render import render
        from ..fileio import ensure_dir, write_atomic
        discovery, common = self._driver_files()
        home = self.agent.hook_home()
        if not alloc.own_spec:
            # The same devices get the same edits until the node spec changes: made once, and
            # the one dict rendered once for every answer and event that carries it.
            key = (alloc.devices, home)
            merged = self._node_edits.get(key)
            if merged is None:
                _, merged = transient.build_transient_spec(discovery, alloc.id, records, home.spec_interpreter,
                                                           import_path=home.import_path, common=common)
                if len(self._node_edits) >= 1024:
                    self._node_edits.clear()
                self._node_edits[key] = merged
            return dataclasses.replace(alloc, cdi_devices=self._node_names(alloc), container_edits=merged,
                                       spec_path=None)
        spec, merged = transient.build_transient_spec(discovery, alloc.id, records, home.spec_interpreter,
                                                      extra=self._client_edits(alloc), import_path=home.import_path,
                                                      common=common)
        path = transient.spec_file(self.host, alloc.id)
        ensure_dir(path.parent, 0o755)
        text = render(spec)
        try:
            unchanged = path.read_text() == text
        except OSError:
            unchanged = False
        if not unchanged:
            write_atomic(path, text, mode=0o644, durable=False)
        return dataclasses.replace(alloc, cdi_devices=tuple(f"{spec['kind']}={d['name']}" for d in spec["devices"]),
                                   container_edits=merged, spec_path=str(path))

    def _client_edits(self, alloc: alloc_rules.Allocation) -> dict:
        """Worker: an MPS allocation's client edits (pipe, shm, limits) for its device. The
        sharing state gives the limits, so a restore at start (before the sharing view
        exists) writes the same spec."""
        if alloc.mps:
            return claimmps.client_edits(self.host, alloc, alloc.mps)
        if alloc.shared_as != "mps":
            return {}
        from ..sharing.clients import mps_client_edits
        from ..sharing.state import SharingState
        devices = SharingState.load(self.host).devices
        mps_config = alloc.request["sharing"].get("mpsConfig")
        return {u: mps_client_edits(self.host, u, devices.get(u), mps_config) for u in alloc.devices}

    def _timeslices(self, allocations) -> None:
        """Worker: the GPUs' time-slices as the allocations ask (timeslices.py)."""
        gpus = self._gpu_uuids()
        self.timeslices.apply(timeslices.wanted(allocations, gpus), gpus)

    def _gpu_uuids(self) -> set[str]:
        return {g.uuid for g in self.agent.inventory.gpus} if self.agent.inventory else set()

    def _checkpoint_only(self, alloc, others, replaced) -> bool:
        """Whether committing ``alloc`` writes nothing but the checkpoint: node names, whose
        edits are made already for its devices and the node spec in force; no MPS daemon of
        its own, no MIG device made for it, no time-slice to change; nothing of a replaced
        allocation to tear down."""
        return (not alloc.own_spec and not alloc.own_mps_devices() and not alloc.made
                and not any(a.own_spec or a.mps or a.made for a in replaced)
                and self._files is not None and self._files[0] is self.agent.spec
                and (alloc.devices, self.agent.hook_home()) in self._node_edits
                and self.timeslices.settled(timeslices.wanted([*others, alloc], self._gpu_uuids())))

    def _release_checkpoint_only(self, allocs, others) -> bool:
        """Whether releasing ``allocs`` writes nothing but the checkpoint: no spec, MPS
        daemon or MIG device of theirs to remove, no time-slice to change."""
        return (not any(a.own_spec or a.mps or a.made for a in allocs)
                and self.timeslices.settled(timeslices.wanted(others, self._gpu_uuids())))

    @staticmethod
    def _release_purpose(allocs) -> str:
        return f"release {', '.join(a.id for a in allocs)}"

    def _gpus(self, uuids) -> list[str]:
        """Which of ``uuids`` are whole GPUs (not MIG devices)."""
        gpus = {g.uuid for g in self.agent.inventory.gpus} if self.agent.inventory else set()
        return [u for u in uuids if u in gpus]

    def _start_own_mps(self, alloc, known=None) -> dict:
        """Worker: the allocation's own MPS daemon (claimmps.py), running; its record."""
        devices = alloc.own_mps_devices()
        home = self.agent.hook_home()
        return claimmps.start(self.host, alloc, devices, self._gpus(devices), known, home.interpreter,
                              home.import_path)

    def _commit_new(self, alloc, records, others, replaced) -> alloc_rules.Allocation:
        """A commit (``Agent.commit``): its own MPS daemon (if it asks for one), the spec,
        the GPUs' time-slices, then the checkpoint (the commit point; the allocations it
        replaces leave it in the same write), then what the replaced ones had is torn down
        as a release's is. The daemon, the spec and the time-slices are undone when the
        commit fails."""
        with _unwritable(f"record allocation {alloc.id}", self.host.state_dir), \
                node_lock(self.host, f"allocate {alloc.id}"):
            tear_down = self._before_tear_down(replaced)
            try:
                if alloc.own_mps_devices():
                    alloc = dataclasses.replace(alloc, mps=self._start_own_mps(alloc))
            except BaseException:
                madedevices.not_released(self.host, replaced)
                raise
            try:
                alloc = self._prepare(alloc, records)
                faults.point("allocate:after_spec")
                self._timeslices([*others, alloc])
                checkpoint.save(self.host, [*others, alloc])
            except BaseException:
                self._remove_specs([alloc])
                self._timeslices([*others, *replaced])
                if alloc.mps:
                    claimmps.stop(self.host, alloc.mps, self._gpus(alloc.mps["devices"]))
                madedevices.not_released(self.host, replaced)
                raise
            faults.point("allocate:after_checkpoint")
            if alloc.made:
                madedevices.done(self.host)
            self._tear_down(replaced, [*others, alloc], tear_down)
        return alloc

    def _privileged(self, uid: int) -> bool:
        """Root, or a uid the configuration names for kubelet plugins (``api.plugin_uids``)."""
        return uid == 0 or uid in self.agent.settings.api.plugin_uids

    def _may_use_id(self, uid: int, alloc_id: str) -> None:
        """The kubelet plugins' id prefixes are theirs: only root or a plugin uid may use them,
        so no other caller can take a claim's or a container's id before its plugin does."""
        prefix = next((p for p in alloc_rules.RESERVED_PREFIXES if alloc_id.startswith(p)), None)
        if prefix is not None and not self._privileged(uid):
            raise alloc_rules.ReservedId(
                f"allocation ids starting with {prefix!r} are the kubelet plugins': only root or a uid of "
                f"api.plugin_uids may use them", id=alloc_id, uid=uid, hint="use an id of another form")

    def _within_caller_limits(self, alloc: alloc_rules.Allocation, leaving) -> None:
        """A caller that is neither root nor a plugin may hold ``allocations.max_per_caller``
        allocations, of ``allocations.max_bytes_per_caller`` bytes in the checkpoint."""
        if self._privileged(alloc.owner):
            return
        limits = self.agent.settings.allocations
        mine = [a for a in self.agent.allocations.values() if a.owner == alloc.owner and a.id not in leaving]
        size = sum(len(a.checkpoint_json) for a in mine) + len(alloc.checkpoint_json)
        if len(mine) >= limits.max_per_caller:
            raise alloc_rules.AllocationLimitReached(
                f"uid {alloc.owner} has {len(mine)} allocations, the most allocations.max_per_caller allows",
                limit=limits.max_per_caller, uid=alloc.owner,
                hint="release allocations no longer used, or raise allocations.max_per_caller")
        if size > limits.max_bytes_per_caller:
            raise alloc_rules.AllocationLimitReached(
                f"uid {alloc.owner}'s allocations would take {size} bytes in the checkpoint, more than "
                f"allocations.max_bytes_per_caller ({limits.max_bytes_per_caller})",
                limit=limits.max_bytes_per_caller, uid=alloc.owner,
                hint="release allocations no longer used, give shorter labels, or raise "
                     "allocations.max_bytes_per_caller")

    def _may_change_the_node(self, uid: int, what: str) -> None:
        """Allocations that change the node for a claim (MIG devices made for them, an MPS
        daemon of their own): root, or a uid the configuration names (``api.plugin_uids``: a
        DRA plugin not running as root)."""
        if not self._privileged(uid):
            from ..errors import PermissionDenied
            raise PermissionDenied(f"only root or a uid of api.plugin_uids may {what}", uid=uid,
                                   hint="run the DRA plugin as root, or add its uid to api.plugin_uids")

    async def allocate(self, body: dict, owner: int = 0) -> tuple[bool, alloc_rules.Allocation]:
        """Create (True) or return the identical existing (False) allocation, for the caller
        ``owner`` (a uid). The allocations ``body["replaces"]`` names (those that exist) are
        released in the same commit: their devices are free for this one, and a refused
        request releases none. Only an allocation's owner, or root, may replace it, and only
        its owner have it back (root, asking for another uid's, is told 409)."""
        request = alloc_rules.normalize(body)
        self._may_use_id(owner, request["id"])
        if any("mig" in d for d in request["devices"]):
            self._may_change_the_node(owner, "make MIG devices for an allocation")
        async with self.agent.mutex:
            replaced = [self.agent.allocations[r] for r in dict.fromkeys(body.get("replaces") or ())
                        if r in self.agent.allocations and r != request["id"]]
            existing = self.agent.allocations.get(request["id"])
            _refuse_others([*replaced, *([existing] if existing else [])], owner)
            if existing is not None and existing.owner != owner:
                # Root asking again for another uid's id (a plugin's id taken first by someone
                # else): never handed back as root's; released first, it can be made afresh.
                raise alloc_rules.AllocationConflict(
                    f"allocation {request['id']!r} exists, made by uid {existing.owner}",
                    hint="release it first, or use another id", id=request["id"], owner=existing.owner)
            if existing is not None:
                if self._same_request(existing.request, request):
                    if replaced:
                        await self._release_locked(replaced, f"replaced by {existing.id}")
                    return False, existing
                raise alloc_rules.AllocationConflict(
                    f"allocation {request['id']!r} exists with a different request",
                    hint="release it first, or use another id", id=request["id"])
            limits = self.agent.settings.allocations
            leaving = frozenset(a.id for a in replaced)
            if len(self.agent.allocations) - len(leaving) >= limits.max_total:
                raise alloc_rules.AllocationLimitReached(
                    f"the node has {len(self.agent.allocations)} allocations, the most "
                    f"allocations.max_total allows", limit=limits.max_total,
                    hint="release allocations no longer used, or raise allocations.max_total")
            if self.agent.inventory is None:
                raise self._unavailable()
            self.agent.driver.require("make an allocation")
            if any("passthrough" in d for d in request["devices"]):
                self._may_change_the_node(owner, "pass a GPU through")
                alloc = await self.agent.passthrough.allocate(request, owner, replaced, leaving)
                self._remove_specs(replaced)
                self._added(alloc, replaced)
                return True, alloc
            made = await self._make(request) if any("mig" in d for d in request["devices"]) else []
            try:
                users = self.agent.users()
                if leaving:
                    users = {u: [x for x in held if x[0] not in leaving] for u, held in users.items()}
                chosen = alloc_rules.select(
                    _with_made(request, made), self._candidates(), users,
                    resolve=lambda name: self.agent.snapshot.lookup.get(name),
                    healthy=lambda u: (self.agent.health.get(u) or self.agent.default_health).allocatable,
                    max_per_device=limits.max_per_device, taken=self._taken(leaving), links=self.agent.links)
                uuids = chosen.devices
                alloc = alloc_rules.Allocation(id=request["id"], devices=tuple(uuids), request=request,
                                               created=time.time(), replicas=tuple(chosen.replicas),
                                               shared_as=chosen.shared_as, owner=owner,
                                               device_sharing=chosen.sharing, made=tuple(made))
                alloc_rules.check_size(alloc)
                self._within_caller_limits(alloc, leaving)
                if alloc.own_mps_devices():
                    self._may_change_the_node(owner, "start an MPS control daemon for an allocation")
                    claimmps.check_limits(alloc, alloc.own_mps_devices(),
                                          {r.uuid: r.memory_mib for r in self._records(uuids)})
                if alloc.shared_as == "mps":
                    claimmps.check_client_limits(alloc, {r.uuid: r.memory_mib for r in self._records(uuids)})
                others = [a for a in self.agent.allocations.values() if a.id not in leaving]
                alloc = await self.agent.commit(self._commit_new, alloc, self._records(uuids), others, replaced,
                                                purpose=f"allocate {alloc.id}",
                                                on_loop=self._checkpoint_only(alloc, others, replaced))
            except BaseException:
                if made:
                    await self._unmake(made, request["id"], "its allocation failed")
                raise
            finally:
                self.agent.making.clear()
            self._added(alloc, replaced)
            return True, alloc

    def _added(self, alloc, replaced) -> None:
        for old in replaced:
            self.agent.remove_allocation(old.id)
            log.info("allocation %s released: replaced by %s", old.id, alloc.id,
                     extra={"fields": {"allocation_id": old.id}})
        self.agent.add_allocation(alloc)
        log.info("allocation %s created: %s", alloc.id, ", ".join(alloc.cdi_devices),
                 extra={"fields": {"allocation_id": alloc.id}})
        self.agent.publish_soon([*self._deleted(replaced, f"replaced by {alloc.id}"),
                                 ("allocation_created", {"allocation": Rendered(allocation_json(alloc))})],
                                allocations_only=not alloc.passthrough)

    @staticmethod
    def _deleted(allocs, reason: str) -> list:
        return [("allocation_deleted", {"reason": reason, "allocation": Rendered(allocation_json(a))}) for a in allocs]

    def _remove_specs(self, allocs) -> None:
        for alloc in allocs:
            if alloc.own_spec:
                try:
                    os.unlink(transient.spec_file(self.host, alloc.id))
                except FileNotFoundError:
                    pass

    def _commit_release(self, allocs, others) -> None:
        """A commit (``Agent.commit``): the checkpoint without them (the commit point), then
        what they had torn down (``_tear_down``). A commit that fails changes nothing: their
        MPS daemons serve on and their MIG devices stay. A MIG device in use refuses the
        release before it (the allocations stay)."""
        with _unwritable(self._release_purpose(allocs), self.host.state_dir), \
                node_lock(self.host, self._release_purpose(allocs)):
            made = self._before_tear_down(allocs)
            try:
                self.agent.passthrough.release(allocs)
                checkpoint.save(self.host, others)
            except BaseException:
                madedevices.not_released(self.host, allocs)
                raise
            if any(a.passthrough for a in allocs):
                self.agent.passthrough.released()
            faults.point("release:after_checkpoint")
            self._tear_down(allocs, others, made)

    def _before_tear_down(self, allocs) -> list[dict]:
        """Worker, under the node lock, before the commit that drops ``allocs``: their MIG
        devices idle (InUse: refused, nothing changed), and recorded, so that a crash
        between the commit and their destruction is finished at the next start; the MIG
        devices to destroy after it (theirs, and those of earlier releases still there)."""
        made = [m for a in allocs for m in a.made]
        if not made:
            return []
        madedevices.check_idle(self.host, made)
        return madedevices.releasing(self.host, allocs)

    def _tear_down(self, allocs, others, made: list[dict]) -> None:
        """Worker, under the node lock, after the commit that dropped ``allocs``: their MPS
        daemons stopped, the MIG devices ``made`` destroyed, their specs removed, the GPUs'
        time-slices as ``others`` ask. The commit is done: a step that fails is logged and
        the rest go on; the next start finishes what is left (an MPS daemon no allocation
        has, the releasing record's MIG devices, a spec no allocation owns)."""
        ids = ", ".join(a.id for a in allocs)
        for a in allocs:
            if a.mps:
                try:
                    claimmps.stop(self.host, a.mps, self._gpus(a.mps["devices"]))
                except (HostagentError, OSError) as e:
                    log.error("MPS daemon of released allocation %s not stopped: %s (the next start stops it)",
                              a.id, getattr(e, "message", e))
        if made:
            try:
                madedevices.unmake(self.host, made, self.agent.mig._refresh_spec)
                madedevices.released(self.host)
            except (HostagentError, OSError) as e:
                log.error("MIG devices of released allocation(s) %s not destroyed: %s (the next start destroys "
                          "them)", ids, getattr(e, "message", e))
        self._remove_specs(allocs)
        faults.point("release:after_spec")
        try:
            self._timeslices(others)
        except HostagentError as e:
            log.error("time-slices not restored after releasing %s: %s", ids, e.message)

    async def _release_locked(self, allocs, reason: str) -> None:
        gone = {a.id for a in allocs}
        others = [a for a in self.agent.allocations.values() if a.id not in gone]
        back = [rec["gpu"] for a in allocs for rec in a.passthrough]
        # A GPU coming back to the nvidia driver changes NVML's indices and handles: the
        # monitor and the sampler start again on the inventory read after it.
        async with (self.agent.let_go_of_gpus(f"GPU {', '.join(back)} back to nvidia") if back
                    else contextlib.nullcontext()):
            try:
                await self.agent.commit(self._commit_release, allocs, others, purpose=self._release_purpose(allocs),
                                        on_loop=self._release_checkpoint_only(allocs, others))
            finally:
                if any(a.made for a in allocs):
                    await self.agent.refresh_locked("MIG devices destroyed")
                elif back:
                    await self.agent.refresh_locked("GPU bound back")
        for alloc in allocs:
            self.agent.remove_allocation(alloc.id)
            log.info("allocation %s released%s", alloc.id, "" if reason == "released" else f": {reason}",
                     extra={"fields": {"allocation_id": alloc.id}})
        self.agent.publish_soon(self._deleted(allocs, reason), allocations_only=True)

    # ---- allocations' own MPS daemons -------------------------------------------------

    async def supervise(self, period: float = 2.0) -> None:
        """Start again the own MPS daemon of an allocation whose daemon exited (its clients
        reconnect to the new one through the same client folder)."""
        while True:
            await asyncio.sleep(period)
            try:
                await self.check_own_daemons()
            except Exception:               # a bug: say so, keep supervising
                log.exception("supervision of the allocations' MPS daemons failed")

    async def check_own_daemons(self) -> list[str]:
        """The allocations whose daemon was started again."""
        from ..processes import ProcessRecord, current
        dead = [a.id for a in self.agent.allocations.values()
                if a.mps and not current(ProcessRecord.from_dict(a.mps.get("process")))]
        if not dead or self.agent.mutex.locked():
            return []
        restarted = []
        async with self.agent.mutex:
            for alloc_id in dead:
                alloc = self.agent.allocations.get(alloc_id)
                if alloc is None or current(ProcessRecord.from_dict(alloc.mps.get("process"))):
                    continue                # released, or restarted, meanwhile
                try:
                    alloc = await self.agent.blocking(self._restart_own_mps, alloc)
                except HostagentError as e:
                    log.error("MPS daemon of allocation %s exited and did not start again: %s", alloc_id, e.message,
                              extra={"fields": {"allocation_id": alloc_id}})
                    continue
                self.agent.add_allocation(alloc)
                restarted.append(alloc_id)
                log.warning("MPS daemon of allocation %s had exited: started again", alloc_id,
                            extra={"fields": {"allocation_id": alloc_id}})
            if restarted:
                self.agent.publish()
        return restarted

    def _restart_own_mps(self, alloc):
        """Worker: its daemon started afresh and recorded in the checkpoint."""
        with node_lock(self.host, f"restart the MPS daemon of {alloc.id}"):
            alloc = dataclasses.replace(alloc, mps=self._start_own_mps(alloc))
            checkpoint.save(self.host, [alloc if a.id == alloc.id else a for a in self.agent.allocations.values()])
        return alloc

    # ---- MIG devices made for an allocation ---------------------------------------------

    def _make_work(self, request: dict) -> list[dict]:
        with node_lock(self.host, f"make MIG devices for {request['id']}"):
            return madedevices.make(self.host, request["id"], request, self.agent.mig._refresh_spec)

    async def _make(self, request: dict) -> list[dict]:
        """Make the request's MIG devices and read the node again (their CDI names are in the
        node spec before they are selected); they show as made for it meanwhile."""
        made = await self.agent.blocking(self._make_work, request)
        self.agent.making.update({m["uuid"]: request["id"] for m in made})
        log.info("MIG devices made for %s: %s", request["id"],
                 ", ".join(f"{m['profile']}@{m['start']} {m['uuid']}" for m in made),
                 extra={"fields": {"allocation_id": request["id"]}})
        await self.agent.refresh_locked("MIG devices made")
        return made

    def _unmake_work(self, made: list[dict]) -> None:
        with node_lock(self.host, "destroy MIG devices made"):
            try:
                madedevices.unmake(self.host, made, self.agent.mig._refresh_spec, force=True)
            finally:
                madedevices.done(self.host)

    async def _unmake(self, made: list[dict], alloc_id: str, why: str) -> None:
        try:
            await self.agent.blocking(self._unmake_work, made)
            log.info("MIG devices made for %s destroyed: %s", alloc_id, why)
        except HostagentError as e:
            log.error("MIG devices made for %s not destroyed (%s): %s", alloc_id, why, e.message)
        self.agent.making.clear()
        await self.agent.refresh_locked("MIG devices destroyed")

    async def release(self, alloc_id: str, caller: int = 0) -> alloc_rules.Allocation:
        """Release an allocation of ``caller`` (a uid; root may release any)."""
        async with self.agent.mutex:
            alloc = self.agent.allocations.get(alloc_id)
            if alloc is None:
                # Kubelet plugins retry unprepare: for them this answer means "done".
                raise UnknownName(f"no allocation {alloc_id!r}: already released, or never made",
                                  name=alloc_id, id=alloc_id, hint="nothing to release; a retried release "
                                  "may take this as done")
            _refuse_others([alloc], caller)
            await self._release_locked([alloc], "released")
            return alloc

    def _unavailable(self):
        from ..errors import UnavailableError
        e = self.agent.inventory_error
        return UnavailableError("the node's inventory is not available" + (f": {e.message}" if e else ""),
                                hint="see GET /v1/node and the agent's log")

    def restore(self, saved: list) -> tuple[list, list[tuple[str, str]]]:
        """Worker: rewrite the specs of checkpointed allocations whose devices are all still
        there and allocatable; drop the others; remove specs no allocation owns."""
        kept, dropped = [], []
        present = {uuid for uuid, names in self.agent.cdi_names.items() if names}
        with node_lock(self.host, "restore allocations"):
            held = checkpoint.held_devices(self.agent.checkpoint_damage) if self.agent.checkpoint_damage \
                else frozenset()
            notes = madedevices.recover(self.host, saved, self.agent.mig._refresh_spec, held)
            self.undone_at_start = bool(notes)
            for note in notes:
                log.warning("%s", note)
            changed = False
            for alloc in saved:
                if alloc.passthrough:
                    why = self.agent.passthrough.still_bound(alloc)
                    if why:
                        dropped.append((alloc.id, why))
                    else:
                        kept.append(self.agent.passthrough.restored(alloc))
                    continue
                gone = [u for u in alloc.devices if u not in present]
                if gone:
                    dropped.append((alloc.id, f"device(s) {', '.join(gone)} gone or no longer allocatable"))
                    continue
                try:
                    if alloc.mps:           # its daemon adopted if it still runs, else started again
                        record = self._start_own_mps(alloc, alloc.mps.get("process"))
                        changed |= record != alloc.mps
                        alloc = dataclasses.replace(alloc, mps=record)
                    kept.append(self._prepare(alloc, self._records(alloc.devices)))
                except HostagentError as e:
                    dropped.append((alloc.id, e.message))
            # What an unreadable checkpoint record may own stays until an admin dismisses it.
            for name in claimmps.orphans(self.host, kept):
                if self.agent.checkpoint_damage and claimmps.may_be_held(self.host, name, held):
                    log.warning("MPS daemon %s kept: no allocation has it, but an unreadable checkpoint record "
                                "may (until it is dismissed)", name)
                    continue
                claimmps.stop_orphan(self.host, name, set(self._gpus(present)))
                log.warning("MPS daemon %s stopped: no allocation has it", name)
            owned = {transient.safe_id(a.id) for a in kept if a.own_spec}
            for sid, path in transient.transient_spec_files(self.host).items():
                if sid not in owned and self.agent.checkpoint_damage:
                    log.warning("transient spec %s kept: no allocation owns it, but an unreadable checkpoint record "
                                "may (until it is dismissed)", path, extra={"fields": {"spec": str(path)}})
                elif sid not in owned:
                    os.unlink(path)
                    log.warning("removed transient spec %s: no allocation owns it", path,
                                extra={"fields": {"spec": str(path)}})
            for tmp in transient.stray_temporaries(self.host) + checkpoint.stray_temporaries(self.host):
                tmp.unlink(missing_ok=True)
                log.info("removed %s, left by an interrupted write", tmp)
            if len(kept) != len(saved) or changed:
                checkpoint.save(self.host, kept)
            try:
                self._timeslices(kept)
            except HostagentError as e:
                log.error("time-slices of the allocations not set: %s", e.message)
        return kept, dropped


def _with_made(request: dict, made: list[dict]) -> dict:
    """The request with each MIG device to make named by the UUID it was made with."""
    if not made:
        return request
    uuids = iter(m["uuid"] for m in made)
    devices = [{**{k: v for k, v in d.items() if k != "mig"}, "device": next(uuids)} if "mig" in d else d
               for d in request["devices"]]
    return {**request, "devices": devices}
