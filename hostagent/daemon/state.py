"""What the agent publishes at one revision, and the events between two of them.

A ``Snapshot`` is immutable once built; the agent replaces it after every change, and the
API caches rendered responses on it, so a read costs one dictionary lookup until the next
change. ``diff`` turns two device maps into the events a watcher needs to go from one to
the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Snapshot", "diff_devices", "lookup_table"]


@dataclass
class Snapshot:
    revision: int
    node: dict                           # node facts (without the revision)
    devices: dict[str, dict]             # uuid -> device view, each with its own revision
    unreadable: list[dict]
    allocations: dict                    # id -> Allocation
    lookup: dict[str, str]               # index, UUID, MIG name, CDI name -> uuid
    profiles: dict = field(default_factory=dict)   # GPU uuid -> its MIG profiles (views)
    labels: object = None                # nodelabels.LabelResult
    unread: list = field(default_factory=list)   # facts NVML refused the daemon (model.unread)
    cache: dict = field(default_factory=dict)   # rendered responses, per key

    def find(self, ident: str) -> dict | None:
        uuid = self.lookup.get(ident.strip())
        return self.devices.get(uuid) if uuid else None

    def cached(self, key, render):
        """``render()`` once per snapshot and key."""
        try:
            return self.cache[key]
        except KeyError:
            value = self.cache[key] = render()
            return value

    @property
    def gpus(self) -> list[dict]:
        return [d for d in self.devices.values() if d["kind"] == "gpu"]

    @property
    def mig_devices(self) -> list[dict]:
        return [d for d in self.devices.values() if d["kind"] == "mig"]


def lookup_table(devices: dict[str, dict]) -> dict[str, str]:
    """Every name a device goes by: its name (index or gpu:mig), UUID and CDI names, and
    each CDI name's device part (``nvidia.com/gpu=0`` and ``gpu=0`` are accepted too)."""
    out: dict[str, str] = {}
    for uuid, view in devices.items():
        out[view["name"]] = uuid
        out[uuid] = uuid
        for cdi in view["cdi_devices"]:
            out[cdi] = uuid
            out[cdi.rpartition("/")[2]] = uuid
    return out


def _comparable(view: dict) -> dict:
    return {k: v for k, v in view.items() if k != "revision"}


def diff_devices(old: dict[str, dict], new: dict[str, dict]) -> list[tuple[str, str, list[str]]]:
    """(event type, uuid, changed fields) from ``old`` to ``new``: removals first (so a name
    reused by a new device is free again when its addition arrives), then additions and
    changes in ``new``'s order."""
    events = [("device_removed", uuid, []) for uuid in old if uuid not in new]
    for uuid, view in new.items():
        before = old.get(uuid)
        if before is None:
            events.append(("device_added", uuid, []))
            continue
        before = _comparable(before)
        changed = sorted(k for k in view if k != "revision" and before.get(k) != view[k])
        if changed:
            events.append(("device_changed", uuid, changed))
    return events
