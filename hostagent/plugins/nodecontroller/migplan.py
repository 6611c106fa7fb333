"""MIG by label, pure: mig-manager's contract turned into steps. The node's labels, the
``--mig-config`` file and the agent's plan of the wanted config become what to write
(``nvidia.com/mig.config.state``), whether to apply, and the Event that says why.

    no label                    nothing (removing the label changes nothing)
    a bad file, an unknown name failed, a Warning naming the file's configs
    the agent cannot plan it    failed, a Warning with the agent's reason (it does not fit)
    nothing to change           success
    devices in use in the way   --on-busy: wait (pending, a Warning naming them), fail, evict
                                (devices an unreadable checkpoint record may hold: waited for, or fail)
    otherwise                   pending, apply; then success or failed
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import NORMAL, WARNING
from .keys import FAILED, MIG_CONFIG, PENDING, SUCCESS

__all__ = ["Step", "wanted", "check_name", "after_plan", "refused", "applied", "busy_text", "ON_BUSY"]

ON_BUSY = ("wait", "fail", "evict")
FAILED_REASON, WAITING_REASON, APPLIED_REASON, EVICTING_REASON = (
    "MIGConfigFailed", "MIGConfigWaiting", "MIGConfigApplied", "MIGConfigEvicting")


@dataclass(frozen=True)
class Step:
    state: str | None = None            # the state label to write now (None: leave it)
    apply: bool = False                 # apply the config now
    event: tuple | None = None          # (type, reason, message)
    busy: tuple = ()                    # allocations in the way: {id, labels, devices}
    evict: bool = False                 # evict the pods holding them first


def wanted(labels: dict) -> str | None:
    """The config the label asks for; None without it (or empty, as mig-manager ignores)."""
    return (labels or {}).get(MIG_CONFIG) or None


def _failed(name: str, why: str) -> Step:
    return Step(FAILED, event=(WARNING, FAILED_REASON, f"MIG config {name!r} not applied: {why}"))


def check_name(name: str, mig_file) -> Step | None:
    """A failed step when the file cannot be used or lacks ``name``; None when it can (or
    when the agent's own configs are used: the agent names what it has)."""
    if mig_file.problem:
        return _failed(name, mig_file.problem)
    if mig_file.spec is not None and name not in mig_file.spec.configs:
        return _failed(name, f"{mig_file.path} has no config {name!r} (configs: {', '.join(mig_file.names)})")
    return None


def busy_text(busy) -> str:
    """``allocation A (claim ns/c) holds MIG-..., MIG-...; allocation B holds ...``"""
    parts = []
    for a in busy:
        if a.get("unreadable"):
            parts.append(f"{a['id']} of the agent's allocations checkpoint (kept in {a['unreadable']['kept_as']}) "
                         f"may hold {', '.join(a.get('devices') or ())} until an admin dismisses it")
            continue
        labels = a.get("labels") or {}
        owner = f" (claim {labels['claim']})" if labels.get("claim") else \
            f" ({labels['resource']})" if labels.get("resource") else ""
        parts.append(f"allocation {a['id']}{owner} holds {', '.join(a.get('devices') or ())}")
    return "; ".join(parts)


def after_plan(name: str, answer: dict, on_busy: str) -> Step:
    """The step after the agent's ``POST /v1/mig/plan`` answer for ``name``."""
    plan = answer.get("plan") or {}
    busy = tuple(answer.get("busy") or ())
    if not plan.get("changed"):
        return Step(SUCCESS)
    if not busy:
        return Step(PENDING, apply=True)
    what = busy_text(busy)
    if on_busy == "fail":
        return _failed(name, f"it would take away devices in use: {what}")
    # No pod holds what an unreadable checkpoint record may hold: an eviction frees none of
    # it, the admin's dismissal does. Waited for, whatever --on-busy says.
    if on_busy == "evict" and not any(a.get("unreadable") for a in busy):
        return Step(PENDING, busy=busy, evict=True,
                    event=(NORMAL, EVICTING_REASON, f"MIG config {name!r}: cordoning the node and evicting the pods "
                                                    f"holding devices it takes away: {what}"))
    return Step(PENDING, busy=busy,
                event=(WARNING, WAITING_REASON, f"MIG config {name!r} waits for devices in use: {what}; it is "
                                                "applied as soon as they are released"))


def refused(name: str, message: str) -> Step:
    """The agent refused to plan or apply it (an unknown name, a config that does not fit)."""
    return _failed(name, message)


def applied(name: str, answer: dict) -> Step:
    changed = answer.get("changed") or (answer.get("plan") or {}).get("changed") or []
    gpus = ", ".join(str(i) for i in changed)
    return Step(SUCCESS, event=(NORMAL, APPLIED_REASON,
                                f"MIG config {name!r} applied" + (f" (GPU {gpus} changed)" if gpus else "")))
