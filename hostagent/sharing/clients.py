"""What a container sharing a device with MPS needs, as container edits: the daemon's socket,
``CUDA_MPS_PIPE_DIRECTORY``, the shared ``/dev/shm`` and the limits.

The daemon's client directory (its ``control`` socket and nothing else: see ``mps``) is
mounted read-only at ``/tmp/nvidia-mps`` (CUDA's default pipe directory, where the DRA
driver mounts the whole pipe directory, read-write), so a client finds the daemon with or
without the variable, and cannot change anything the daemon or the agent uses. The
limits are the daemon's defaults (or lower ones the allocation asked for, the DRA driver's
``mpsConfig``) as the client's own variables, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=<MiB>M``: the container sees its one device as 0):
they hold whichever server the client meets. The log directory is not given (the device
plugin took it out of the workload, its PR #537).
"""

from __future__ import annotations

from ..cdi.edits import IPC_MOUNT_OPTIONS, Edits, Mount
from ..hostroot import HostRoot
from . import mps
from .config import quantity_mib
from .resolve import DeviceSharing

__all__ = ["CONTAINER_PIPE", "mps_client_edits", "asked_pinned_mib", "limit_too_large"]

CONTAINER_PIPE = "/tmp/nvidia-mps"
SOCKET_MOUNT_OPTIONS = ("ro", *IPC_MOUNT_OPTIONS)


def _mib(quantity: str | None) -> int | None:
    return None if quantity is None else max(1, quantity_mib(quantity))


def asked_pinned_mib(uuid: str, mps_config: dict | None) -> int | None:
    """The pinned memory limit an allocation's ``mpsConfig`` asks for a client of device
    ``uuid`` (its UUID's, else index 0's: the client sees its one device as 0, else the
    default), in MiB; None when it asks none."""
    mps_config = mps_config or {}
    per_device = mps_config.get("defaultPerDevicePinnedMemoryLimit") or {}
    return _mib(per_device.get(uuid) or per_device.get("0") or mps_config.get("defaultPinnedDeviceMemoryLimit"))


def limit_too_large(uuid: str, limit_mib: int, memory_mib: int):
    """The error for a pinned memory limit above the device's memory: as the node's sharing
    configuration bounds its own, a limit past the memory names no real bound."""
    from ..errors import UsageError
    return UsageError(f"sharing.mpsConfig: the pinned memory limit of device {uuid} ({limit_mib} MiB) is more "
                      f"than its memory ({memory_mib} MiB)", device=uuid, limit_mib=limit_mib, memory_mib=memory_mib,
                      hint="give defaultPinnedDeviceMemoryLimit (or the device's defaultPerDevicePinnedMemoryLimit) "
                           "at most the device's memory")


def mps_client_edits(host: HostRoot, uuid: str, device: DeviceSharing | None, mps_config: dict | None = None) -> Edits:
    """Edits for a client of the MPS daemon of device ``uuid`` (``device``: its sharing in
    force, for the limits; ``mps_config``: the allocation's ``mpsConfig``, which may lower them)."""
    threads = device.active_thread_percentage if device else None
    pinned = device.pinned_memory_limit_mib if device else None
    mps_config = mps_config or {}
    if mps_config.get("defaultActiveThreadPercentage") is not None:
        asked = mps_config["defaultActiveThreadPercentage"]
        threads = asked if threads is None else min(threads, asked)
    asked = asked_pinned_mib(uuid, mps_config)
    if asked is not None:
        pinned = asked if pinned is None else min(pinned, asked)
    env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE}"]
    if threads is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}")
    if pinned is not None:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={pinned}M")
    return Edits(env=tuple(env), mounts=(Mount(host.on_host(mps.client_dir(host, uuid)), CONTAINER_PIPE,
                                               SOCKET_MOUNT_OPTIONS),
                                         Mount(host.on_host(mps.shm_dir(host)), "/dev/shm", IPC_MOUNT_OPTIONS)))
