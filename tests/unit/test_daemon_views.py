"""Device and allocation views: what the caches keep equals what is made afresh."""

import json
from dataclasses import replace

from hostagent.daemon.allocations import Allocation
from hostagent.daemon.health import Health, unmonitored
from hostagent.daemon.views import BaseViews, allocation_json, device_views
from hostagent.model import allocation as allocation_view
from hostagent.devices import Inventory
from hostagent.sim.driverroot import create_node
from hostagent.sim.platform import simulated_host


def _inventory(tmp_path, profile="dgx-a100"):
    from hostagent.devices import read_inventory
    create_node(tmp_path, profile)
    return read_inventory(simulated_host(tmp_path))


def test_views_from_the_kept_inventory_part_equal_fresh_ones_and_follow_a_new_inventory(tmp_path):
    inventory = _inventory(tmp_path)
    uuid = inventory.gpus[0].uuid
    names = {g.uuid: (f"nvidia.com/gpu={g.index}",) for g in inventory.gpus}
    health = {uuid: Health("unhealthy", "xid", "XID 79", 5.0)}
    users = {uuid: [("a", "Exclusive")]}
    base = BaseViews()
    kept = device_views(inventory, names, health, users, unmonitored(1.0), base=base)
    assert kept == device_views(inventory, names, health, users, unmonitored(1.0))
    assert kept[uuid]["allocations"] == ["a"] and kept[uuid]["health"]["state"] == "unhealthy"
    kept[uuid]["revision"] = 7                  # the agent marks its views; the kept part stays clean
    again = device_views(inventory, names, {}, {}, unmonitored(1.0), base=base)
    assert "revision" not in again[uuid] and again[uuid]["allocations"] == []
    renamed = Inventory(**{**inventory.__dict__, "gpus": [replace(inventory.gpus[0], name="Renamed"),
                                                           *inventory.gpus[1:]]})
    assert device_views(renamed, names, {}, {}, unmonitored(1.0), base=base)[uuid]["product"] == "Renamed"


def test_a_health_renders_the_same_every_time_and_callers_cannot_change_it():
    h = Health("healthy", "healthy", "ok", 1.23456)
    first = h.to_dict()
    first["state"] = "changed"
    assert h.to_dict() == {"state": "healthy", "reason": "healthy", "message": "ok", "since": 1.235,
                           "monitored": True, "problems": []}


def test_allocation_json_is_the_allocation_view():
    edits = {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "mounts": [{"hostPath": "/a", "containerPath": "/a"}]}
    alloc = Allocation(id="k8s/a", devices=("GPU-1",), request={"id": "k8s/a", "devices": [{"device": "GPU-1"}],
                       "sharing": {"strategy": "Exclusive"}}, created=1.5, cdi_devices=("nvidia.com/gpu=0",),
                       container_edits=edits)
    assert json.loads(allocation_json(alloc)) == allocation_view(alloc)
    other = replace(alloc, id="k8s/b", container_edits={"env": ["X=1"]})
    assert json.loads(allocation_json(other))["container_edits"] == {"env": ["X=1"]}
    assert json.loads(allocation_json(alloc))["container_edits"] == edits
