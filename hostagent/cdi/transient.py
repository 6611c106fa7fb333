"""Transient CDI specs: one file per allocation in ``/var/run/cdi``, gone when it is released.

Named by CDI's own convention (``GenerateTransientSpecName``): ``<vendor>-<class>_<id>``,
with ``/`` in the id replaced by ``_``. CDI replaces it alone, so ``a/b`` and ``a_b`` would
share a file; here the mapping is one-to-one (``safe_id``): ``_`` and ``.`` are escaped
first, so a name says which id it is and no id can take another's file or device names
(an id that would escape to a name too long for a file is named by a hash of it).
Device names are ``<id>-gpu<index>`` and ``<id>-mig<gpu>:<mig>``, so a plugin only relays
``<vendor>/<class>=<id>-...`` names and two allocations can never define the same device.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..devices import Gpu, MigDevice
from ..hostroot import HostRoot
from .discover import Discovery
from .edits import Edits
from .plain import plain_edits
from .spec import HOOK_IMPORT_PATH, common_edits, edits_to_cdi, hook_work
from .version import minimum_version

__all__ = ["ALLOCATION_KIND", "MAX_SAFE_ID", "safe_id", "spec_file_name", "spec_file", "device_name",
           "build_transient_spec", "transient_spec_files", "stray_temporaries"]

ALLOCATION_KIND = "hostagent.io/allocation"
MAX_SAFE_ID = 128           # characters: the longest id's length, escaped or not
_HEAD = 40                  # an id's characters kept in front of the hash (at most 80 escaped)


def safe_id(allocation_id: str) -> str:
    """The id in a file and CDI device name (no ``/`` there), one-to-one: ``.`` -> ``..``,
    ``_`` -> ``._``, then ``/`` -> ``_``. Read back left to right, ``..`` is a ``.``, ``._``
    a ``_`` and a lone ``_`` a ``/``: two ids never share a name. The common ids (a claim's
    ``k8s-dra/<uid>``) keep CDI's own form.

    An id that escapes to more than ``MAX_SAFE_ID`` characters (one of 128 made mostly of
    ``.`` and ``_``) would make a file name longer than a directory entry holds (255
    bytes, with the temporary name of its atomic write): it is named by the escaped form of
    its first ``_HEAD`` characters, ``.h`` and a hash of the whole id. No escaped form has a
    ``.`` followed by ``h``, so such a name is never another id's escaped form."""
    escaped = _escape(allocation_id)
    if len(escaped) <= MAX_SAFE_ID:
        return escaped
    digest = hashlib.sha256(allocation_id.encode()).hexdigest()[:32]
    return f"{_escape(allocation_id[:_HEAD])}.h{digest}"


def _escape(allocation_id: str) -> str:
    return allocation_id.replace(".", "..").replace("_", "._").replace("/", "_")


def spec_file_name(allocation_id: str, kind: str = ALLOCATION_KIND) -> str:
    vendor, cls = kind.split("/", 1)
    return f"{vendor}-{cls}_{safe_id(allocation_id)}.json"


def spec_file(host: HostRoot, allocation_id: str, kind: str = ALLOCATION_KIND) -> Path:
    return host.cdi_dir / spec_file_name(allocation_id, kind)


def transient_spec_files(host: HostRoot, kind: str = ALLOCATION_KIND) -> dict[str, Path]:
    """Transient spec files of ``kind`` in the CDI directory, by safe id."""
    vendor, cls = kind.split("/", 1)
    prefix = f"{vendor}-{cls}_"
    try:
        entries = list(host.cdi_dir.iterdir())
    except FileNotFoundError:
        return {}
    return {p.name[len(prefix):-len(".json")]: p for p in entries
            if p.name.startswith(prefix) and p.name.endswith(".json")}


def stray_temporaries(host: HostRoot, kind: str = ALLOCATION_KIND) -> list[Path]:
    """Temporary files an atomic write of a transient spec left behind when its writer was
    killed half-way (engines ignore them; nobody else removes them)."""
    vendor, cls = kind.split("/", 1)
    try:
        return sorted(host.cdi_dir.glob(f".{vendor}-{cls}_*.tmp"))
    except OSError:
        return []


def device_name(allocation_id: str, device: Gpu | MigDevice) -> str:
    local = f"gpu{device.index}" if isinstance(device, Gpu) else f"mig{device.name}"
    return f"{safe_id(allocation_id)}-{local}"


def build_transient_spec(discovery: Discovery, allocation_id: str,
                         devices: list[Gpu | MigDevice], interpreter: str | None,
                         kind: str = ALLOCATION_KIND, extra: dict[str, Edits] | None = None, *,
                         import_path: str = HOOK_IMPORT_PATH, common: Edits | None = None) -> tuple[dict, dict]:
    """The allocation's spec, and the same devices as plain edits (env, mounts, device
    nodes, no hook) for callers that cannot use CDI. ``interpreter``: the hook's, None for
    no hook (``HookHome.spec_interpreter``). ``extra``: more edits for a device, by
    UUID (an MPS client's pipe, shm and limits); ``common``: ``common_edits(discovery)``
    when the caller has it already (the driver's files, found once per node spec). Raises
    MissingDeviceNode for a device without its nodes."""
    extra = extra or {}
    per_device = [(dev, Edits.merge(discovery.gpu(dev) if isinstance(dev, Gpu) else discovery.mig_device(dev),
                                    extra.get(dev.uuid, Edits())))
                  for dev in devices]
    described = [edits for _, edits in per_device]
    common = common_edits(discovery) if common is None else common
    spec = {"cdiVersion": "", "kind": kind,
            "devices": [{"name": device_name(allocation_id, dev), "containerEdits": edits.to_cdi()}
                        for dev, edits in per_device],
            "containerEdits": edits_to_cdi(Edits.merge(common, hook_work(described)), interpreter,
                                           import_path=import_path)}
    spec["cdiVersion"] = minimum_version(spec)
    return spec, plain_edits(Edits.merge(common, *described), [dev.uuid for dev in devices])
