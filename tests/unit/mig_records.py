"""Inventory records for planner tests, built from the simulator's SKU data without NVML."""

from hostagent.devices.records import (ComputeInstance, Gpu, GpuInstance, Inventory, MigProfile,
                                       MigState, Placement)
from hostagent.mig.profiles import ci_shapes
from hostagent.sim import catalog
from hostagent.sim.node import gpu_instance_id

A100 = "A100-SXM4-40GB"
A100_80 = "A100-SXM4-80GB"
A30 = "A30-24GB"
H100 = "H100-SXM5-80GB"
H200 = "H200-SXM-141GB"
T4 = "T4"


def profiles(sku_key: str) -> tuple[MigProfile, ...]:
    sku = catalog.skus()[sku_key]
    return tuple(MigProfile(index=p.index, id=p.id, name=p.name, slices=p.slices,
                            instances=p.instances, memory_mib=p.memory_mib,
                            multiprocessors=p.multiprocessors, copy_engines=p.copy_engines,
                            decoders=p.decoders, encoders=p.encoders, jpegs=p.jpegs, ofas=p.ofas,
                            placements=tuple(Placement(s, p.memory_slices) for s in p.placements))
                 for p in sku.mig.gi_profiles)


def gpu(index: int, sku_key: str, *, enabled: bool = False, pending: bool | None = None,
        gis=(), table: tuple[MigProfile, ...] | None = None) -> Gpu:
    """``gis``: (profile name, start, [(ci slices, ci start), ...]); None CIs = one full CI."""
    sku = catalog.skus()[sku_key]
    mig = None
    if sku.mig is not None:
        table = table or profiles(sku_key)
        by_name = {p.name: p for p in table}
        memory = max(pl.start + pl.size for p in table for pl in p.placements)
        records = []
        for name, start, cis in gis:
            p = by_name[name]
            if cis is None:
                cis = [(p.slices, 0)]
            shapes = {s.slices: s.profile_id for s in ci_shapes(p.slices)}
            records.append(GpuInstance(
                id=gpu_instance_id(start, p.memory_slices, memory), profile_id=p.id, profile=p.name,
                placement=Placement(start, p.memory_slices),
                compute_instances=tuple(ComputeInstance(id=i, profile_id=shapes[c], slices=c,
                                                        placement=Placement(s, c))
                                        for i, (c, s) in enumerate(cis))))
        mig = MigState(enabled=enabled, pending=enabled if pending is None else pending,
                       profiles=table, gpu_instances=tuple(sorted(records, key=lambda g: g.id)))
    cc = "%d.%d" % sku.compute_capability
    return Gpu(index=index, minor=index, uuid=f"GPU-{index:04d}", name=sku.name, serial=None,
               memory_mib=sku.memory_mib, pci_bus_id=f"00000000:{index + 1:02X}:00.0",
               pci_device_id=sku.pci_device_id, compute_capability=cc,
               architecture=sku.architecture, mig=mig, pci_subsystem_id=sku.pci_subsystem_id)


def inventory(*gpus: Gpu) -> Inventory:
    return Inventory(driver_version="550.90.07", cuda_driver_version="12.4", nvml_version="12.550",
                     gpus=tuple(gpus))
