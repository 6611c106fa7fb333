"""GPU health: NVML events (from ``devices.events``) become typed health events, per-device
health state with recovery, and a monitor thread that publishes every change.

Pure parts: ``policy`` (which XIDs count), ``fanout`` (who an event affects), ``state``
(transitions), ``view`` (health in device listings). Shell: ``monitor`` (the thread),
``statefile`` and ``clear_requests`` (the run-dir view and clear requests between processes).
"""

from .fanout import DeviceIndex, DeviceRef, to_health_event
from .monitor import HealthMonitor
from .options import HealthOptions
from .policy import DEFAULT_IGNORED_XIDS, XidPolicy
from .records import (ECC_DBE, GPU_LOST, KINDS, UNMONITORED, XID, DeviceHealth, HealthEvent,
                      HealthUpdate, Reason)
from .state import HealthState
from .view import annotate

__all__ = ["HealthMonitor", "HealthOptions", "XidPolicy", "DEFAULT_IGNORED_XIDS", "DeviceIndex",
           "DeviceRef", "to_health_event", "HealthState", "HealthEvent", "HealthUpdate",
           "DeviceHealth", "Reason", "annotate", "KINDS", "XID", "ECC_DBE", "GPU_LOST",
           "UNMONITORED"]
