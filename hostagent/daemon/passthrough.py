"""Passthrough allocations: a whole GPU, with its IOMMU group, bound to vfio-pci for a VM
while the allocation lives, and bound back to its drivers when it is released.

A request's ``passthrough`` item names a GPU (index, UUID, or PCI bus id, which also names
a GPU on vfio-pci already) and whether the container wants iommufd's nodes. The GPU moves
only when nothing uses it: no allocation of it or its MIG devices, no process, no MIG
device, not shared by the node's sharing configuration (MPS or time-slicing). The move is
recorded (``vfio.ledger``), journaled (``vfio.executor``) and committed with the
checkpoint; a crash between is settled at the next start, where every GPU the agent put on
vfio-pci that no allocation holds goes back. While it is passed through the GPU is out of
NVML and so out of the inventory and the node's CDI spec: nothing else can be given it. Its
allocation's own CDI spec holds the group's VFIO nodes only (``vfio.cdi``).
"""

from __future__ import annotations

import dataclasses
import logging

from ..cdi import transient
from .. import faults
from ..errors import HostagentError, UsageError
from ..lock import node_lock
from ..vfio import executor, pci
from ..vfio.cdi import passthrough_edits
from ..vfio.plan import VFIO_DRIVERS, plan_bind
from . import checkpoint

__all__ = ["PassthroughOps", "spec_for"]

log = logging.getLogger("hostagent.daemon")


def spec_for(host, alloc) -> tuple[dict, dict]:
    """Worker: the allocation's CDI spec (a device per GPU) and its plain edits."""
    from ..cdi.version import minimum_version
    devices, nodes, env = [], [], []
    for n, rec in enumerate(alloc.passthrough):
        edits = passthrough_edits(host, rec["group"], [f["bdf"] for f in rec["functions"]], rec.get("iommufd", False))
        devices.append({"name": f"{transient.safe_id(alloc.id)}-vfio{n}", "containerEdits": edits.to_cdi()})
        nodes += [{"path": d.path, "hostPath": d.host_path, "permissions": "rwm"} for d in edits.device_nodes
                  if d.path not in {x["path"] for x in nodes}]
        env = list(edits.env)
    spec = {"cdiVersion": "", "kind": transient.ALLOCATION_KIND, "devices": devices}
    spec["cdiVersion"] = minimum_version(spec)
    return spec, {"env": env, "deviceNodes": nodes, "mounts": []}


def _with_spec(alloc, spec: dict, plain: dict, path):
    """The allocation answering with its spec's CDI names and plain edits."""
    return dataclasses.replace(alloc, cdi_devices=tuple(f"{spec['kind']}={d['name']}" for d in spec["devices"]),
                               container_edits=plain, spec_path=str(path))


def _pcie_root(host, bdf: str) -> str | None:
    """The PCIe root a function sits under (``pci0000:16``), from its sysfs folder."""
    import os
    path = os.path.realpath(host.host(f"/sys/bus/pci/devices/{bdf}"))
    return next((p for p in path.split(os.sep) if p.startswith("pci")), None)


class PassthroughOps:
    def __init__(self, agent):
        self.agent = agent
        self.host = agent.host

    # ---- finding the GPU -------------------------------------------------------------

    def _find(self, name: str) -> tuple[pci.PciGpu, object]:
        """Worker: the PCI GPU a request names, and its inventory record (None when NVML
        does not see it: on vfio-pci already)."""
        from .allocations import UnknownDevice
        gpus = pci.read_gpus(self.host)
        inv = self.agent.inventory
        record = None
        uuid = self.agent.snapshot.lookup.get(name)
        for g in (inv.gpus if inv else ()):
            if g.uuid == uuid or str(g.index) == name:
                record = g
        bdf = record.sysfs_bus_id if record else name.lower().removeprefix("0000")
        found = next((g for g in gpus if g.bdf == bdf or g.bdf.endswith(bdf) and len(bdf) >= 7), None)
        if found is None:
            raise UnknownDevice(f"no GPU {name!r} on this node",
                                hint="name a GPU by index or UUID, as GET /v1/devices lists it, or by PCI bus id",
                                device=name)
        record = next((g for g in (inv.gpus if inv else ()) if g.sysfs_bus_id == found.bdf), None)
        return found, record

    def _busy(self, record, leaving: frozenset) -> str | None:
        """Why the GPU (its inventory record) cannot move now; None when it can."""
        if record is None:
            return None
        ids = {record.uuid, *(d.uuid for d in (record.mig.devices if record.mig else ()))}
        holders = sorted({a for u in ids for a, _ in self.agent.users().get(u, ()) if a not in leaving})
        if holders:
            return f"allocation {', '.join(holders)} holds it"
        if record.mig and record.mig.devices:
            return f"it has {len(record.mig.devices)} MIG device(s)"
        shared = self.agent.sharing.devices()
        for u in ids:
            entry = shared.get(u) or {}
            if entry.get("strategy") or entry.get("mps"):
                return f"the node's sharing configuration shares it ({entry.get('strategy') or 'mps'})"
        return None

    def _processes(self, record) -> str | None:
        """Worker: processes on the GPU, as NVML lists them."""
        import pynvml as N
        from ..devices import nvml_session
        try:
            with nvml_session(self.host):
                handle = N.nvmlDeviceGetHandleByUUID(record.uuid.encode())
                procs = N.nvmlDeviceGetComputeRunningProcesses(handle)
        except (N.NVMLError, HostagentError):
            return None
        if procs:
            return f"{len(procs)} process(es) run on it (pid {', '.join(str(p.pid) for p in procs[:5])})"
        return None

    # ---- allocate ---------------------------------------------------------------------

    def _commit(self, alloc, others, replaced, items):
        """Worker, a commit: vfio-pci loaded, each GPU's plan (refused when busy), its move
        journaled and made, the spec, the checkpoint (the commit point), the journal gone.
        Nothing is left moved when it fails. A GPU an allocation it replaces passes through
        stays on vfio-pci, taken over with the drivers it goes back to; the replaced
        allocations' other GPUs go back once it is committed."""
        moved, records = [], []
        carried = {rec["gpu"]: rec for a in replaced for rec in a.passthrough}
        with node_lock(self.host, f"pass through for {alloc.id}"):
            try:
                executor.ensure_vfio_pci(self.host)
                facts = pci.read_facts(self.host)
                for item, busy in items:
                    gpu, record = self._find(item["gpu"])
                    if gpu.bdf in carried:
                        records.append({**carried.pop(gpu.bdf), "id": alloc.id, "iommufd": bool(item.get("iommufd"))})
                        continue
                    busy = busy or (self._processes(record) if record is not None else None)
                    plan = plan_bind(gpu, facts, busy)
                    rec = executor.bind(self.host, plan, alloc.id, record.uuid if record else None, faults.point)
                    rec["iommufd"] = bool(item.get("iommufd"))
                    moved.append(rec)
                    records.append(rec)
                    if len(items) > 1:
                        executor.done(self.host)
                # Its devices by UUID, a GPU on vfio-pci already too (NVML does not name it).
                alloc = dataclasses.replace(alloc, passthrough=tuple(records),
                                            devices=tuple(r.get("uuid") or r["gpu"] for r in records))
                spec, plain = spec_for(self.host, alloc)
                path = self._write_spec(alloc, spec)
                checkpoint.save(self.host, [*others, alloc])
            except BaseException:
                for rec in moved:
                    try:
                        executor.unbind(self.host, rec)
                    except HostagentError as e:
                        log.error("%s", e.message)
                executor.done(self.host)
                transient.spec_file(self.host, alloc.id).unlink(missing_ok=True)
                raise
            executor.done(self.host)
            faults.point("passthrough:committed")
            for rec in carried.values():       # released with their allocations: back, journaled
                try:
                    executor.release(self.host, rec)
                except HostagentError as e:    # still recorded (vfio.ledger): the next start tries again
                    log.error("%s", e.message)
                    continue
                executor.done(self.host)
        return _with_spec(alloc, spec, plain, path)

    def _write_spec(self, alloc, spec):
        from ..cdi.render import render
        from ..fileio import ensure_dir, write_atomic
        path = transient.spec_file(self.host, alloc.id)
        ensure_dir(path.parent, 0o755)
        write_atomic(path, render(spec), mode=0o644, durable=False)
        return path

    async def allocate(self, request: dict, owner: int, replaced: list, leaving: frozenset):
        """A passthrough allocation (the agent's mutex held)."""
        import time
        from .allocations import Allocation, DeviceBusy
        items = [d["passthrough"] for d in request["devices"]]
        found = [await self.agent.blocking(self._find, item["gpu"]) for item in items]
        bdfs = [g.bdf for g, _ in found]
        if len(set(bdfs)) != len(bdfs):
            raise UsageError("a GPU is asked for twice", devices=bdfs)
        held = {rec["gpu"]: a.id for a in self.agent.allocations.values() if a.id not in leaving
                for rec in a.passthrough}
        for gpu, _ in found:
            if gpu.bdf in held:
                raise DeviceBusy(f"GPU {gpu.bdf} is passed through for allocation {held[gpu.bdf]}",
                                 device=gpu.bdf, allocations=[held[gpu.bdf]])
        checked = [(item, self._busy(record, leaving)) for item, (_, record) in zip(items, found)]
        uuids = tuple(record.uuid if record else gpu.bdf for gpu, record in found)
        alloc = Allocation(id=request["id"], devices=uuids, request=request, created=time.time(), owner=owner)
        others = [a for a in self.agent.allocations.values() if a.id not in leaving]
        # The agent's own NVML holds the GPU open: the driver would refuse its unbind lock.
        async with self.agent.let_go_of_gpus(f"GPU {', '.join(bdfs)} to vfio-pci for {alloc.id}"):
            try:
                alloc = await self.agent.commit(self._commit, alloc, others, replaced, checked,
                                                purpose=f"pass through for {alloc.id}", on_loop=False)
            finally:
                # NVML lists the GPUs left to it (or all again): the monitor and the sampler
                # start on what it says now.
                await self.agent.refresh_locked("GPU passed through")
        for rec in alloc.passthrough:
            log.info("GPU %s (group %s: %s) passed through for %s", rec["gpu"], rec["group"],
                     ", ".join(f["bdf"] for f in rec["functions"]), alloc.id,
                     extra={"fields": {"allocation_id": alloc.id}})
        return alloc

    # ---- the bus -----------------------------------------------------------------------

    def read_bus(self) -> tuple:
        """Worker: (VfioFacts, the PCI GPUs), read with the inventory."""
        return pci.read_facts(self.host), pci.read_gpus(self.host)

    def for_vms(self, bdf: str) -> bool:
        """Whether the admin keeps the GPU at ``bdf`` for VMs (``passthrough.vm_gpus``)."""
        marked = (self.agent.settings.sections.get("passthrough") or {}).get("vm_gpus") or []
        return marked == "all" or any(bdf == m.lower() or bdf.endswith(":" + m.lower()) for m in marked)

    def view(self) -> dict | None:
        """The node view's ``vfio``: the kernel's VFIO facts and every NVIDIA GPU on the bus
        with its driver, IOMMU group, whether it is kept for VMs and, passed through, its
        allocation (loop thread)."""
        if self.agent.vfio is None:
            return None
        facts, gpus = self.agent.vfio
        held = {rec["gpu"]: (a.id, rec.get("uuid")) for a in self.agent.allocations.values() for rec in a.passthrough}
        inv = {g.sysfs_bus_id: g for g in (self.agent.inventory.gpus if self.agent.inventory else ())}
        out = []
        for g in gpus:
            record = inv.get(g.bdf)
            alloc, uuid = held.get(g.bdf, (None, None))
            out.append({"index": g.index, "pci_bus_id": g.bdf, "vendor_id": g.function.vendor,
                        "device_id": g.device_id, "product": g.product, "driver": g.driver or None,
                        "uuid": record.uuid if record else uuid, "numa_node": g.numa_node,
                        "pcie_root": record.pcie_root if record else _pcie_root(self.host, g.bdf),
                        "iommu_group": g.iommu_group, "group": [f.bdf for f in g.group],
                        "addressable_memory": g.addressable_memory, "vfio_cdev": g.vfio_cdev,
                        "for_vms": self.for_vms(g.bdf), "allocation": alloc})
        return {"iommu": facts.iommu, "iommufd": facts.iommufd, "vfio_pci": facts.vfio_pci, "gpus": out}

    # ---- release, start ---------------------------------------------------------------

    def release(self, allocs) -> None:
        """Worker, under the node lock (the release's commit): their GPUs bound back."""
        for a in allocs:
            for rec in a.passthrough:
                executor.release(self.host, rec)
                faults.point("passthrough:released")

    def released(self) -> None:
        """Worker: the checkpoint no longer has them: the journal goes."""
        executor.done(self.host)

    def settle(self, saved: list) -> list:
        """Worker, at start, before NVML is read: an interrupted move settled from its
        journal; allocations whose GPUs are no longer on vfio-pci (a reboot) dropped; every
        GPU the agent put on vfio-pci that no allocation holds bound back (``sweep``)."""
        with node_lock(self.host, "settle a passthrough"):
            settled, notes = executor.settle(self.host, saved)
            kept = []
            for alloc in settled:
                why = self.still_bound(alloc) if alloc.passthrough else None
                if why:
                    notes.append(f"allocation {alloc.id} dropped: {why}")
                else:
                    kept.append(alloc)
            notes += executor.sweep(self.host, kept, self.for_vms)
            if len(kept) != len(saved):
                checkpoint.save(self.host, kept)
        for note in notes:
            log.warning("%s", note)
        return kept

    def still_bound(self, alloc) -> str | None:
        """Worker: why a checkpointed passthrough allocation no longer holds its GPUs (a
        reboot, someone binding them back), or None: they are on vfio-pci."""
        for rec in alloc.passthrough:
            for f in rec["functions"]:
                driver = executor.driver_of(self.host, f["bdf"])
                if driver not in VFIO_DRIVERS:
                    return f"PCI function {f['bdf']} of GPU {rec['gpu']} is on {driver or 'no driver'}, not vfio-pci"
        return None

    def restored(self, alloc):
        """Worker: the spec of a kept passthrough allocation, written again."""
        spec, plain = spec_for(self.host, alloc)
        return _with_spec(alloc, spec, plain, self._write_spec(alloc, spec))


