"""Where NVML's MIG profile table is known to be wrong, and the values to use instead.

A30 (0x20B710DE): nvmlDeviceGetGpuInstanceProfileInfo reports wrong instanceCount values,
which is why mig-parted hardcodes the A30's profiles (mig.md 1.1). The true maxima are the
MIG user guide's (mig.md 3.4), the same as mig-parted's table. The planner's instance
limits and the bundled config's ``all-<profile>`` counts come from here for that SKU.
"""

from __future__ import annotations

from dataclasses import replace

from ..devices.records import Gpu, MigProfile

__all__ = ["mig_profiles"]

_INSTANCES = {
    0x20B710DE: {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1},
}


def mig_profiles(gpu: Gpu) -> tuple[MigProfile, ...]:
    """The GPU's MIG profiles with known NVML errors corrected."""
    counts = _INSTANCES.get(gpu.pci_device_id)
    if counts is None:
        return gpu.mig.profiles
    return tuple(replace(p, instances=counts.get(p.name, p.instances)) for p in gpu.mig.profiles)
