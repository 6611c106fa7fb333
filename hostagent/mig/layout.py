"""Exact MIG layouts: mode plus every GPU and compute instance with its placement.

A ``Layout`` is what the checkpoint saves, what the planner aims at and what recovery
compares against, so it carries placements and never driver-assigned ids (ids are
reassigned when instances are re-created; placements are what the user cares about).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..devices.records import Gpu, Placement
from .profiles import ci_name

__all__ = ["CiLayout", "GiLayout", "Layout"]


@dataclass(frozen=True, order=True)
class CiLayout:
    start: int                  # on the GPU instance's compute-slice axis
    slices: int
    profile_id: int             # NVML compute-instance profile id

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.slices)


@dataclass(frozen=True, order=True)
class GiLayout:
    start: int                  # on the memory-slice axis
    size: int
    profile_id: int
    profile: str                # "3g.20gb"
    slices: int                 # compute slices of the profile
    cis: tuple[CiLayout, ...] = ()

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.size)

    @property
    def key(self) -> tuple[int, int]:
        """What makes two GPU instances the same one for keeping: profile and placement."""
        return self.profile_id, self.start

    def ci_names(self) -> list[str]:
        return [ci_name(c.slices, self.slices, self.profile) for c in self.cis]

    def describe(self) -> str:
        inner = ""
        if self.cis and [c.slices for c in self.cis] != [self.slices]:
            inner = " [" + ", ".join(f"{c.slices}c@{c.start}" for c in self.cis) + "]"
        elif not self.cis:
            inner = " [no compute instance]"
        return f"{self.profile}@{self.placement}{inner}"


@dataclass(frozen=True)
class Layout:
    enabled: bool               # current MIG mode
    pending: bool               # mode after the next reset; == enabled when nothing is pending
    gis: tuple[GiLayout, ...] = ()

    @classmethod
    def of(cls, gpu: Gpu) -> "Layout":
        mig = gpu.mig
        if mig is None:
            return cls(False, False)
        by_id = {p.id: p for p in mig.profiles}
        gis = []
        for gi in mig.gpu_instances:
            prof = by_id[gi.profile_id]
            cis = tuple(sorted(CiLayout(c.placement.start, c.slices, c.profile_id)
                               for c in gi.compute_instances))
            gis.append(GiLayout(gi.placement.start, gi.placement.size, gi.profile_id, prof.name,
                                prof.slices, cis))
        return cls(mig.enabled, mig.pending, tuple(sorted(gis)))

    @property
    def settled(self) -> bool:
        return self.enabled == self.pending

    def reached_by(self, actual: "Layout") -> bool:
        """Whether the node's ``actual`` layout is this target: the same, or, where the target
        leaves the mode pending for a reset, that mode already in effect (an idle Ampere GPU
        resets itself as SetMigMode asks it to; only a busy one waits)."""
        return actual == self or (not self.settled and actual == Layout(self.pending, self.pending, self.gis))

    def counts(self) -> dict[str, int]:
        """mig-parted's view: compute instances per profile name."""
        return dict(Counter(name for gi in self.gis for name in gi.ci_names()))

    def describe(self) -> str:
        mode = "enabled" if self.enabled else "disabled"
        if not self.settled:
            mode += f" (pending {'enabled' if self.pending else 'disabled'})"
        if not self.gis:
            return f"MIG {mode}" + (", no instances" if self.enabled else "")
        return f"MIG {mode}: " + ", ".join(gi.describe() for gi in self.gis)

    # ---- journal form --------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"enabled": self.enabled, "pending": self.pending,
                "gpu_instances": [{"profile": g.profile, "profile_id": g.profile_id,
                                   "slices": g.slices, "placement": {"start": g.start, "size": g.size},
                                   "compute_instances": [
                                       {"profile_id": c.profile_id, "slices": c.slices,
                                        "placement": {"start": c.start, "size": c.slices}}
                                       for c in g.cis]}
                                  for g in self.gis]}

    @classmethod
    def from_dict(cls, raw: dict) -> "Layout":
        gis = tuple(sorted(
            GiLayout(g["placement"]["start"], g["placement"]["size"], g["profile_id"], g["profile"],
                     g["slices"], tuple(sorted(CiLayout(c["placement"]["start"], c["slices"], c["profile_id"])
                                               for c in g["compute_instances"])))
            for g in raw["gpu_instances"]))
        return cls(raw["enabled"], raw["pending"], gis)
