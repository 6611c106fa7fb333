"""The names the node controller reads and writes on its Node: NVIDIA's (mig-manager's and
the device plugin config-manager's labels), node-problem-detector's kind of condition, and
hostagent's own."""

from __future__ import annotations

__all__ = ["MIG_CONFIG", "MIG_STATE", "SHARING_CONFIG", "SHARING_STATE", "PENDING", "SUCCESS", "FAILED",
           "CONDITION", "TAINT", "CORDONED_BY", "COMPONENT"]

MIG_CONFIG = "nvidia.com/mig.config"                      # mig-manager: the named config wanted
MIG_STATE = "nvidia.com/mig.config.state"                 # mig-manager: pending, success, failed
SHARING_CONFIG = "nvidia.com/device-plugin.config"        # config-manager: the named sharing config
SHARING_STATE = "nvidia.com/device-plugin.config.state"   # hostagent's: NVIDIA has no such label
PENDING, SUCCESS, FAILED = "pending", "success", "failed"

CONDITION = "GPUUnhealthy"                  # True while a GPU is unhealthy (a problem-type condition)
TAINT = "nvidia.com/gpu.unhealthy"          # with --taint-unhealthy: every GPU of the node is unhealthy
CORDONED_BY = "hostagent.io/cordoned-by"    # the features that cordoned the node, comma-separated
COMPONENT = "hostagent-node-controller"     # the Events' source, the writes' field manager
