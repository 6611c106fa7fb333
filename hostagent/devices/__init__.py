"""The node's GPU inventory, read through pynvml into immutable records."""

from .reader import mig_profile_name, nvml_session, read_inventory
from .records import (ComputeInstance, Gpu, GpuInstance, GpuProcess, Inventory, MigDevice,
                      MigProfile, MigState, Placement, Unread, UnreadableGpu)

__all__ = ["read_inventory", "nvml_session", "mig_profile_name", "Inventory", "Gpu",
           "UnreadableGpu", "Unread", "MigState", "MigProfile", "MigDevice", "GpuInstance",
           "ComputeInstance", "Placement", "GpuProcess"]
