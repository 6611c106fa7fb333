"""Whether and how a GPU goes to vfio-pci, pure: the GPU and the functions of its IOMMU
group, each with the driver it has now (the one it goes back to), or a refusal in one line
that says what to do.

A group is usable by a VM only when every function in it is bound to a VFIO driver or to
none (vfio.rst, "viable" groups), so the GPU takes its group along: an HD-audio function
beside it goes too. A bridge cannot go (vfio-pci does not take bridges), and another GPU in
the group would go with it: both refuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConflictError, StateError
from .pci import PciGpu, VfioFacts

__all__ = ["Move", "BindPlan", "PassthroughRefused", "PassthroughUnavailable", "plan_bind", "VFIO_DRIVERS",
           "VFIO_DRIVER"]

VFIO_DRIVER = "vfio-pci"
# Drivers that give a device to userspace through VFIO (Grace systems' variant driver too).
VFIO_DRIVERS = ("vfio-pci", "nvgrace_gpu_vfio_pci")


class PassthroughRefused(ConflictError):
    """The GPU cannot go now (in use, or its group cannot move)."""
    code = "passthrough_refused"


class PassthroughUnavailable(StateError):
    """The node cannot pass GPUs through (IOMMU off, no vfio-pci)."""
    code = "passthrough_unavailable"


@dataclass(frozen=True)
class Move:
    bdf: str
    driver: str               # the driver it has now, and goes back to ("" none)


@dataclass(frozen=True)
class BindPlan:
    gpu: PciGpu
    moves: tuple[Move, ...]   # the GPU first, then its group's other functions

    def record(self) -> list[dict]:
        return [{"bdf": m.bdf, "driver": m.driver} for m in self.moves]


def plan_bind(gpu: PciGpu, facts: VfioFacts, busy: str | None = None) -> BindPlan:
    """The moves putting ``gpu`` and its group on vfio-pci. ``busy``: why the GPU is in use
    (an allocation, processes, MIG devices, MPS), None when it is free."""
    name = f"GPU {gpu.bdf}"
    if not facts.iommu or gpu.iommu_group is None:
        raise PassthroughUnavailable(
            f"{name} cannot be passed through: the IOMMU is off (no IOMMU groups in /sys/kernel/iommu_groups)",
            gpu=gpu.bdf, hint="boot the kernel with the IOMMU on (intel_iommu=on or amd_iommu=on, and iommu=pt), "
                              "and VT-d or AMD-Vi enabled in the firmware")
    if busy and gpu.driver not in VFIO_DRIVERS:
        raise PassthroughRefused(f"{name} is in use: {busy}", gpu=gpu.bdf,
                                 hint="release what uses it first, or ask for another GPU")
    for f in gpu.group:
        if f.bridge:
            raise PassthroughRefused(
                f"{name} cannot be passed through: its IOMMU group {gpu.iommu_group} holds the PCI bridge {f.bdf}, "
                "which vfio-pci cannot take", gpu=gpu.bdf, group=gpu.iommu_group, function=f.bdf,
                hint="put the GPU in a slot whose IOMMU group it has alone (a switch with ACS)")
        if f.pci_class >> 16 == 0x03 and f.driver not in VFIO_DRIVERS:
            raise PassthroughRefused(
                f"{name} cannot be passed through alone: its IOMMU group {gpu.iommu_group} holds the GPU {f.bdf} too",
                gpu=gpu.bdf, group=gpu.iommu_group, function=f.bdf,
                hint="put the GPUs in slots with IOMMU groups of their own (a switch with ACS)")
    moves = (Move(gpu.bdf, gpu.driver), *(Move(f.bdf, f.driver) for f in gpu.group))
    return BindPlan(gpu, moves)
