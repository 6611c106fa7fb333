"""The daemon's device views: the model's documents (``hostagent.model``) with what only
the daemon knows (CDI names, health, allocations, sharing, replicas), and allocations as
compact JSON.

The device view carries everything a device plugin's ListAndWatch or a DRA driver's
ResourceSlice needs (identity, PCI address, product, architecture, compute capability,
memory, MIG placement and engines), plus the device's CDI names, health and the allocations
using it.
"""

from __future__ import annotations

import json

from .. import model
from ..devices import Inventory

__all__ = ["device_views", "BaseViews", "allocation_json", "with_device_marks"]


class BaseViews:
    """The inventory's part of the device views, made once per inventory: every allocation
    and health change publishes the views again, and only their other fields change."""

    def __init__(self):
        self._inventory = None
        self._views: dict[str, dict] = {}

    def of(self, inventory: Inventory) -> dict[str, dict]:
        if inventory is not self._inventory:
            self._inventory, self._views = inventory, model.inventory_devices(inventory)
        return self._views


def device_views(inventory: Inventory | None, cdi_names: dict[str, tuple[str, ...]],
                 health: dict, users: dict[str, list[tuple[str, str]]], default_health,
                 sharing: dict[str, dict] | None = None, base: BaseViews | None = None,
                 made_for: dict[str, str] | None = None) -> dict[str, dict]:
    """uuid -> view (without its revision), GPUs then MIG devices, in index order.

    A device is allocatable when the node spec describes it (a GPU with MIG enabled is
    used through its MIG devices, and a device missing its nodes is left out of the spec)
    and it is not unhealthy. ``sharing``: uuid -> how it is shared (``GET /v1/sharing``'s
    device entries); its ``replicas`` are the ids a device plugin advertises for it.
    ``base``: where the inventory's part is kept between calls (each view is a copy of it).
    ``made_for``: MIG device uuid -> the allocation it was made for (``made_for`` of its view).
    """
    sharing = sharing or {}
    made_for = made_for or {}
    if inventory is None:
        return {}
    parts = base.of(inventory) if base is not None else model.inventory_devices(inventory)
    out = {}
    for uuid, part in parts.items():
        h = health.get(uuid) or default_health
        names = list(cdi_names.get(uuid, ()))
        shared = sharing.get(uuid)
        out[uuid] = model.daemon_device(
            part, h.to_dict(), names, bool(names) and h.allocatable, sorted(a for a, _ in users.get(uuid, ())),
            shared, list(shared["replica_ids"]) if shared and names else [uuid] if names else [])
        out[uuid]["made_for"] = made_for.get(uuid)
    return out


# id -> (container edits, their JSON): an allocation's edits are most of its view (the
# driver's libraries and tools), and allocations of the same devices share one edits dict
# (see the allocator), so each is rendered once for every answer and event carrying it.
_EDITS_JSON: dict[int, tuple[dict, bytes]] = {}


def _edits_json(edits: dict) -> bytes:
    hit = _EDITS_JSON.get(id(edits))
    if hit is not None and hit[0] is edits:
        return hit[1]
    out = json.dumps(edits, separators=(",", ":")).encode()
    if len(_EDITS_JSON) >= 64:
        del _EDITS_JSON[next(iter(_EDITS_JSON))]          # the oldest
    _EDITS_JSON[id(edits)] = (edits, out)
    return out


# id -> (allocation, its view's JSON but its edits): an allocation is rendered for the answer
# that creates it, its allocation_created event and, often soon after, the allocation_deleted
# event of the one that replaces it (allocations are immutable: one rendering serves all).
_HEAD_JSON: dict[int, tuple[object, bytes]] = {}


def _head_json(alloc) -> bytes:
    hit = _HEAD_JSON.get(id(alloc))
    if hit is not None and hit[0] is alloc:
        return hit[1]
    view = model.allocation(alloc)
    del view["container_edits"]
    out = json.dumps(view, separators=(",", ":")).encode()
    if len(_HEAD_JSON) >= 64:
        del _HEAD_JSON[next(iter(_HEAD_JSON))]            # the oldest
    _HEAD_JSON[id(alloc)] = (alloc, out)
    return out


def allocation_json(alloc, edits: bool = True) -> bytes:
    """``model.allocation(alloc)`` as compact JSON (its keys in another order); without its
    ``container_edits`` when not ``edits``."""
    head = _head_json(alloc)
    if not edits:
        return head
    return head[:-1] + b',"container_edits":' + _edits_json(alloc.container_edits) + b"}"


def with_device_marks(view: dict, devices: dict[str, dict]) -> dict:
    """An allocation view with ``missing_devices`` (gone from the inventory) and
    ``unhealthy_devices`` (their health says so), each only when not empty."""
    missing = [u for u in view["devices"] if u not in devices]
    unhealthy = [u for u in view["devices"] if u in devices and devices[u]["health"]["state"] == "unhealthy"]
    if missing:
        view = {**view, "missing_devices": missing}
    if unhealthy:
        view = {**view, "unhealthy_devices": unhealthy}
    return view
