"""The names the node controller reads and writes on its Node: NVIDIA's (mig-manager's and
the device plugin config-manager's labels), node-problem-detector's kind of condition, and
hostagent's own."""

from __future__ import annotations

__all__ = ["MIG_CONFIG", "MIG_STATE", "SHARING_CONFIG", "SHARING_STATE", "PENDING", "SUCCESS", "FAILED",
           "CONDITION", "TAINT", "CORDONED_BY", "COMPONENT", "UPGRADE_STATE", "UPGRADE_SKIP", "UPGRADE_VERSION",
           "UPGRADE_ADMITTED", "DRIVER_CONFIGMAP", "EVICTION_STARTED"]

MIG_CONFIG = "nvidia.com/mig.config"                      # mig-manager: the named config wanted
MIG_STATE = "nvidia.com/mig.config.state"                 # mig-manager: pending, success, failed
SHARING_CONFIG = "nvidia.com/device-plugin.config"        # config-manager: the named sharing config
SHARING_STATE = "nvidia.com/device-plugin.config.state"   # hostagent's: NVIDIA has no such label
PENDING, SUCCESS, FAILED = "pending", "success", "failed"

CONDITION = "GPUUnhealthy"                  # True while a GPU is unhealthy (a problem-type condition)
TAINT = "nvidia.com/gpu.unhealthy"          # with --taint-unhealthy: every GPU of the node is unhealthy
CORDONED_BY = "hostagent.io/cordoned-by"    # the features that cordoned the node, comma-separated
# A feature's evictions began (Unix time): their timeout counts from it across restarts
EVICTION_STARTED = "hostagent.io/{}.eviction-started"
COMPONENT = "hostagent-node-controller"     # the Events' source, the writes' field manager

# Driver upgrades across the fleet
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"      # NVIDIA's: the node's step of the walk
UPGRADE_SKIP = "hostagent.io/driver.upgrade"                # =skip: the node is left out
UPGRADE_VERSION = "hostagent.io/driver-upgrade.version"     # annotation: the version the walk is for
UPGRADE_ADMITTED = "hostagent.io/driver-upgrade.admitted"   # annotation: when it took its slot (Unix time)
DRIVER_CONFIGMAP = "hostagent-driver"                       # in --namespace: the fleet's version
