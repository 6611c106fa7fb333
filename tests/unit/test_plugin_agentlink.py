"""The agent link's view of the watch stream: every event is kept; the listeners are woken
only when something they act on changed (not by the plugin's own allocations)."""

from hostagent.plugins.agentlink import AgentLink, NodeView


def _link():
    link = AgentLink("/nonexistent.sock")
    woken = []
    link.listeners.append(woken.append)
    link.owned = lambda alloc_id: alloc_id.startswith("mine/")
    device = {"uuid": "GPU-1", "kind": "gpu", "allocations": [], "health": {"state": "healthy"}}
    link.view = NodeView(connected=True, revision=1, devices={"GPU-1": device})
    return link, woken, device


def _follow(link, event):
    link._take(link.view, event)


def test_own_allocations_are_kept_without_waking_the_listeners():
    link, woken, device = _link()
    _follow(link, {"type": "allocation_created", "revision": 2, "allocation": {"id": "mine/a"}})
    _follow(link, {"type": "device_changed", "revision": 3, "changed": ["allocations"],
                   "device": {**device, "allocations": ["mine/a"]}})
    assert woken == [] and link.view.revision == 3
    assert link.view.devices["GPU-1"]["allocations"] == ["mine/a"]


def test_foreign_allocations_and_other_changes_wake_them():
    link, woken, device = _link()
    _follow(link, {"type": "device_changed", "revision": 2, "changed": ["allocations"],
                   "device": {**device, "allocations": ["mine/a", "dra/claim"]}})
    assert len(woken) == 1                                     # a foreign allocation: health changes
    _follow(link, {"type": "device_changed", "revision": 3, "changed": ["allocations", "health"],
                   "device": {**device, "allocations": ["mine/a"], "health": {"state": "unhealthy"}}})
    assert len(woken) == 2 and woken[-1].devices["GPU-1"]["health"] == {"state": "unhealthy"}
    _follow(link, {"type": "device_changed", "revision": 4, "changed": ["allocations"],
                   "device": {**device, "allocations": []}})
    assert len(woken) == 2                                     # only its own left


def test_a_new_connection_wakes_them_whatever_its_first_event():
    from dataclasses import replace
    link, woken, device = _link()
    link.view = replace(link.view, connected=False, error="lost the agent")
    reconnected = replace(link.view, connected=True, error=None)
    link._take(reconnected, {"type": "device_changed", "revision": 2, "changed": ["allocations"],
                             "device": {**device, "allocations": ["mine/a"]}})
    assert len(woken) == 1 and woken[0].connected
