"""GPU faults the cluster can see, pure: the agent's device health (its watch stream)
becomes Events on the Node, node-problem-detector's kind of condition (``GPUUnhealthy``:
True while a GPU is unhealthy, its message naming them) and, when asked for, a taint.

- ``fault_event``: each health event from NVML (an XID, a double-bit ECC error, a lost GPU)
  is a Warning ``GPUUnhealthy`` naming the GPU's index, UUID, the XID and its meaning; XIDs
  the agent ignores (application errors) are none. Equal messages are counted in one Event
  by the recorder.
- ``transitions``: a device turning healthy again is a Normal ``GPUHealthy``; one found
  unhealthy with no health event seen for it (at start, the driver gate) a Warning.
- ``problems``/``condition``: what is unhealthy now, and the condition saying it.
- ``taint_wanted``: every GPU of the node unhealthy (a node with nothing left to schedule on).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...metrics.xids import xid_name
from .events import NORMAL, WARNING
from .keys import CONDITION

__all__ = ["Problem", "fault_event", "device_why", "problems", "condition", "taint_wanted", "transitions",
           "driver_down", "UNHEALTHY_REASON", "HEALTHY_REASON"]

UNHEALTHY_REASON, HEALTHY_REASON = "GPUUnhealthy", "GPUHealthy"


@dataclass(frozen=True)
class Problem:
    name: str          # "GPU 1", "MIG device 1:3"
    uuid: str
    why: str           # "XID 79, GPU has fallen off the bus"

    def __str__(self) -> str:
        return f"{self.name} ({self.uuid}): {self.why}"


def _xid(code: int) -> str:
    return f"XID {code}, {xid_name(code)}"


def fault_event(event: dict) -> tuple | None:
    """The Warning for one ``health_event``'s ``event`` (None: nothing to tell)."""
    kind = event.get("kind")
    if event.get("ignored") or kind not in ("xid", "ecc_dbe", "gpu_lost"):
        return None
    why = {"xid": lambda: _xid(event.get("xid")), "ecc_dbe": lambda: "double-bit ECC error",
           "gpu_lost": lambda: "the GPU is lost (fallen off the bus)"}[kind]()
    if event.get("gi") is not None:
        why += f", GPU instance {event['gi']}"
    return WARNING, UNHEALTHY_REASON, str(Problem(f"GPU {event.get('gpu')}", event.get("gpu_uuid") or "?", why))


def device_why(device: dict) -> str:
    """Why the agent holds ``device`` unhealthy, in the words of ``fault_event``."""
    health = device.get("health") or {}
    message = health.get("message") or health.get("reason") or "unhealthy"
    m = re.fullmatch(r"XID (\d+)", message.strip())
    return _xid(int(m.group(1))) if m else message


def _name(device: dict) -> str:
    return f"GPU {device.get('index', device.get('name'))}" if device.get("kind") == "gpu" else \
        f"MIG device {device.get('name')}"


def driver_down(node: dict) -> str | None:
    """Why no GPU can be used: the driver does not verify, or is being changed."""
    driver = (node or {}).get("driver") or {}
    if driver.get("state") in ("degraded", "maintenance") and not driver.get("ready"):
        return f"the GPU driver is {driver['state']}: {driver.get('reason') or 'see hostagent driver verify'}"
    return None


def problems(devices: dict, node: dict) -> list[Problem]:
    """The unhealthy GPUs, and MIG devices unhealthy on a healthy GPU, by name."""
    down = driver_down(node)
    gpus = {d["uuid"]: d for d in devices.values() if d.get("kind") == "gpu"}
    out = []
    for d in sorted(devices.values(), key=lambda d: (d.get("kind") != "gpu", d.get("name", ""))):
        parent = gpus.get(d.get("parent_uuid") or "")
        if d.get("kind") == "gpu" and down:
            out.append(Problem(_name(d), d["uuid"], down))
        elif (d.get("health") or {}).get("state") == "unhealthy" and not down:
            if parent is not None and (parent.get("health") or {}).get("state") == "unhealthy":
                continue        # the GPU's own problem says it
            out.append(Problem(_name(d), d["uuid"], device_why(d)))
    return sorted(out, key=lambda p: (not p.name.startswith("GPU"), len(p.name), p.name))


def condition(found: list[Problem], previous: dict | None, now: str) -> dict | None:
    """The ``GPUUnhealthy`` condition for ``found``; None when ``previous`` says it already."""
    status = "True" if found else "False"
    reason = UNHEALTHY_REASON if found else "GPUsHealthy"
    message = "; ".join(str(p) for p in found) if found else "every GPU is healthy"
    if len(message) > 1024:
        message = message[:1021] + "..."
    if previous and (previous.get("status"), previous.get("reason"), previous.get("message")) == \
            (status, reason, message):
        return None
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else now
    return {"type": CONDITION, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or now, "lastHeartbeatTime": now}


def taint_wanted(devices: dict, node: dict) -> bool:
    gpus = [d for d in devices.values() if d.get("kind") == "gpu"]
    if not gpus:
        return False
    return bool(driver_down(node)) or all((d.get("health") or {}).get("state") == "unhealthy" for d in gpus)


def transitions(before: dict, devices: dict, announced: set) -> list[tuple]:
    """Events for devices whose health changed since ``before`` (uuid -> state): back to
    healthy, or unhealthy without a health event having said so (``announced``: the UUIDs
    a fault event named)."""
    out = []
    for uuid, d in sorted(devices.items(), key=lambda kv: kv[1].get("name", "")):
        state, was = (d.get("health") or {}).get("state"), before.get(uuid)
        if state == was:
            continue
        if was == "unhealthy" and state == "healthy":
            out.append((NORMAL, HEALTHY_REASON, f"{_name(d)} ({uuid}) is healthy again"))
        elif state == "unhealthy" and uuid not in announced and d.get("kind") == "gpu":
            out.append((WARNING, UNHEALTHY_REASON, str(Problem(_name(d), uuid, device_why(d)))))
    return out
