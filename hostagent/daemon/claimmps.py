"""MPS control daemons of an allocation's own: an allocation that asks for one
(``own_mps_daemon``, a DRA claim's MPS devices) and shares devices with MPS that the node's
sharing configuration does not share gets a control daemon serving those devices alone
(``CUDA_VISIBLE_DEVICES`` their UUIDs), with its own pipe, log and client folders under
``/run/hostagent/mps/<key>/``, started before the allocation's commit and stopped when it
is released.

The daemon is the sharing package's (``sharing.mps``): known by its process record, never
by a file in its pipe folder or by what another process shows of itself, and its clients
get only its socket, read-only. What it serves is recorded in its own folder (``daemon.json``,
root's, beside the pipe folder, never given to a container) before it starts, so a daemon a
crash left without its allocation is stopped, and its GPUs set back, from that record. Its GPUs are
set to ``EXCLUSIVE_PROCESS`` while it runs (only the MPS server then makes contexts there)
and back to ``DEFAULT`` after, as NVIDIA's DRA driver does; a MIG device's GPU is left as it
is (the mode is the GPU's, shared by its other MIG devices). Its defaults are the claim's
``mpsConfig``: ``defaultActiveThreadPercentage``, and each device's pinned memory limit
(``defaultPerDevicePinnedMemoryLimit`` by UUID or by the device's index among the
daemon's, else ``defaultPinnedDeviceMemoryLimit``); the clients' edits carry the same
limits, as the clients' variables.

``key`` is the daemon's name: ``alloc-`` and a hash of the allocation's id (folder and
systemd unit names must be short and plain, an allocation id need not be).
"""

from __future__ import annotations

import hashlib
import json
import logging

from ..cdi.edits import IPC_MOUNT_OPTIONS, Edits, Mount
from ..errors import UsageError
from ..sharing import mps
from ..sharing.clients import CONTAINER_PIPE, SOCKET_MOUNT_OPTIONS
from ..sharing.config import quantity_mib

__all__ = ["key", "settings", "check_limits", "check_client_limits", "start", "stop", "stop_orphan", "may_be_held",
           "client_edits", "orphans", "PREFIX"]

log = logging.getLogger("hostagent.daemon")

PREFIX = "alloc-"


def key(alloc_id: str) -> str:
    return PREFIX + hashlib.sha256(alloc_id.encode()).hexdigest()[:20]


def _config(alloc, devices: list[str]) -> dict:
    """The one ``mpsConfig`` its daemon's devices share (they share one daemon)."""
    configs = {str(sorted((alloc.sharing_of(u).get("mpsConfig") or {}).items())) for u in devices}
    if len(configs) > 1:
        raise UsageError(f"allocation {alloc.id!r}: its MPS devices share one control daemon, so they need one "
                         f"mpsConfig", hint="give every MPS device of the allocation the same mpsConfig")
    return alloc.sharing_of(devices[0]).get("mpsConfig") or {}


def settings(alloc, devices: list[str]) -> dict:
    """The daemon's defaults, in ``sharing.mps``'s terms: thread percentage, and the pinned
    memory limit of each device by the index the daemon sees it at."""
    config = _config(alloc, devices)
    per_device = config.get("defaultPerDevicePinnedMemoryLimit") or {}
    default = config.get("defaultPinnedDeviceMemoryLimit")
    limits = {}
    for i, uuid in enumerate(devices):
        value = per_device.get(uuid) or per_device.get(str(i)) or default
        if value is not None:
            limits[i] = max(1, quantity_mib(value))
    return {"active_thread_percentage": config.get("defaultActiveThreadPercentage"),
            "pinned_memory_limits_mib": limits}


def check_limits(alloc, devices: list[str], memory_mib: dict[str, int]) -> None:
    """Each device's pinned memory limit is at most its memory (``memory_mib``: uuid -> MiB),
    as the node's sharing configuration bounds it; UsageError otherwise."""
    from ..sharing.clients import limit_too_large
    limits = settings(alloc, devices)["pinned_memory_limits_mib"]
    for i, uuid in enumerate(devices):
        memory = memory_mib.get(uuid)
        if memory is not None and limits.get(i, 0) > memory:
            raise limit_too_large(uuid, limits[i], memory)


def check_client_limits(alloc, memory_mib: dict[str, int]) -> None:
    """The same bound for a client of the node's MPS daemons (an allocation of devices the
    sharing configuration shares with MPS): what its ``mpsConfig`` asks of each device."""
    from ..sharing.clients import asked_pinned_mib, limit_too_large
    for uuid in alloc.devices:
        asked, memory = asked_pinned_mib(uuid, alloc.sharing_of(uuid).get("mpsConfig")), memory_mib.get(uuid)
        if asked is not None and memory is not None and asked > memory:
            raise limit_too_large(uuid, asked, memory)


def _modes(host, gpus: list[str], mode: str) -> None:
    if not gpus:
        return
    from ..devices import nvml_session
    from ..devices.computectl import ComputeControl
    with nvml_session(host):
        ctl = ComputeControl()
        for uuid in gpus:
            ctl.set_mode(uuid, mode)


def start(host, alloc, devices: list[str], gpus: list[str], known=None, interpreter=None,
          import_path: str | None = None) -> dict:
    """Worker: the allocation's daemon running (a recorded one that answers is kept), its
    GPUs in EXCLUSIVE_PROCESS; its record ``{key, devices, process}``. Nothing is left
    changed when it fails."""
    import sys
    from ..processes import ProcessRecord
    name = key(alloc.id)
    values = settings(alloc, devices)
    _write_record(host, name, {"devices": list(devices), "gpus": list(gpus), "process": known})
    _modes(host, gpus, "EXCLUSIVE_PROCESS")
    try:
        record, notes = mps.start(host, name, values, interpreter or sys.executable, import_path,
                                  adopt=known is not None, known=ProcessRecord.from_dict(known), devices=devices)
    except BaseException:
        mps.stop(host, name, ProcessRecord.from_dict(known))
        _modes(host, gpus, "DEFAULT")
        raise
    _write_record(host, name, {"devices": list(devices), "gpus": list(gpus), "process": record.to_dict()})
    for note in notes:
        log.info("MPS daemon of %s: %s", alloc.id, note.removeprefix("note: "))
    return {"key": name, "devices": list(devices), "process": record.to_dict()}


def stop(host, record: dict, gpus: list[str]) -> None:
    """Worker: the daemon ended, its folders gone, its GPUs back in DEFAULT."""
    from ..processes import ProcessRecord
    mps.stop(host, record["key"], ProcessRecord.from_dict(record.get("process")))
    _modes(host, gpus, "DEFAULT")


def client_edits(host, alloc, record: dict) -> dict[str, Edits]:
    """uuid -> what a client of the allocation's daemon gets with that device: its socket
    (read-only, at CUDA's default pipe folder), the shared /dev/shm, the limits."""
    values = settings(alloc, record["devices"])
    env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE}"]
    if values["active_thread_percentage"] is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={values['active_thread_percentage']}")
    limits = values["pinned_memory_limits_mib"]
    if limits:
        env.append("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + ",".join(f"{i}={mib}M" for i, mib in sorted(limits.items())))
    edits = Edits(env=tuple(env), mounts=(
        Mount(host.on_host(mps.client_dir(host, record["key"])), CONTAINER_PIPE, SOCKET_MOUNT_OPTIONS),
        Mount(host.on_host(mps.shm_dir(host)), "/dev/shm", IPC_MOUNT_OPTIONS)))
    return {u: edits for u in record["devices"]}


def _record_path(host, name: str):
    return mps.daemon_dir(host, name) / "daemon.json"


def _write_record(host, name: str, record: dict) -> None:
    from ..fileio import ensure_dir, write_atomic
    ensure_dir(mps.daemon_dir(host, name), 0o755)
    write_atomic(_record_path(host, name), json.dumps(record), mode=0o600, durable=False)


def stop_orphan(host, name: str, gpus: set[str]) -> None:
    """Worker: a daemon no allocation has, ended (the process its record names; without
    one, whatever answers on its pipe folder is asked to quit), and the GPUs its record says
    it was given back in DEFAULT (of ``gpus``, those present)."""
    from ..processes import ProcessRecord
    try:
        record = json.loads(_record_path(host, name).read_text())
        known, served = ProcessRecord.from_dict(record.get("process")), set(record.get("gpus") or ())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        known, served = None, set()
    mps.stop(host, name, known)
    _modes(host, sorted(served & gpus), "DEFAULT")


def may_be_held(host, name: str, held: frozenset | None) -> bool:
    """Whether daemon ``name`` may be the one of an allocation whose checkpoint record could
    not be read: it serves a device of ``held`` (None: any), or its record is unreadable."""
    if held is None:
        return True
    try:
        record = json.loads(_record_path(host, name).read_text())
        served = {str(u) for u in [*(record.get("devices") or ()), *(record.get("gpus") or ())]}
    except (OSError, ValueError, TypeError, AttributeError):
        return True
    return bool(served & held)


def orphans(host, allocations) -> list[str]:
    """Keys of allocation daemons' folders that no allocation records (left by a crash
    between a daemon's start and its allocation's commit, or after its release)."""
    kept = {a.mps["key"] for a in allocations if a.mps}
    return [k for k in mps.find_daemons(host) if k.startswith(PREFIX) and k not in kept]
