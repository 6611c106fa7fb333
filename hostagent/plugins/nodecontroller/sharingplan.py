"""Sharing by label, pure: the device plugin config-manager's choice of a named config.

The label ``nvidia.com/device-plugin.config`` names one of the folder's configs. Without
it: ``--default-sharing-config``, else the config-manager's fallbacks in order: the config
named ``default``, the only config, none (no sharing).
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import NORMAL, WARNING
from .keys import FAILED, SHARING_CONFIG, SUCCESS

__all__ = ["Choice", "choose", "failed", "waiting", "applied", "busy_text", "in_place"]

FAILED_REASON, WAITING_REASON, APPLIED_REASON = "SharingConfigFailed", "SharingConfigWaiting", "SharingConfigApplied"


@dataclass(frozen=True)
class Choice:
    name: str | None                 # the config to apply; None: no sharing
    why: str                         # how it was chosen
    problem: str | None = None       # why none can be chosen (the label or the default names nothing)


def choose(labels: dict, default: str | None, names, folder) -> Choice:
    names = sorted(names)
    listing = ", ".join(names) or "none"
    label = (labels or {}).get(SHARING_CONFIG) or None
    if label is not None:
        if label in names:
            return Choice(label, f"label {SHARING_CONFIG}")
        return Choice(None, "", f"{folder} has no sharing config {label!r} (configs: {listing})")
    if default is not None:
        if default in names:
            return Choice(default, "--default-sharing-config")
        return Choice(None, "", f"--default-sharing-config {default!r} is not in {folder} (configs: {listing})")
    if "default" in names:
        return Choice("default", "the config named default")
    if len(names) == 1:
        return Choice(names[0], "the only config")
    return Choice(None, "no label, no default")


def in_place(current: dict | None, document: dict | None) -> bool:
    """Whether the agent's sharing config (``GET /v1/sharing``'s ``config``) is ``document``
    already (None and an empty config are both no sharing)."""
    return (current or None) == (document or None)


def failed(name: str | None, why: str) -> tuple:
    what = f"sharing config {name!r}" if name else "the sharing config"
    return FAILED, (WARNING, FAILED_REASON, f"{what} not applied: {why}")


def busy_text(devices, allocations) -> str:
    return f"devices {', '.join(devices)} in allocations {', '.join(allocations)}"


def waiting(name: str | None, devices, allocations) -> tuple:
    return (WARNING, WAITING_REASON, f"sharing config {name or 'none'!r} waits for devices in use: "
                                     f"{busy_text(devices, allocations)}; it is applied as soon as they are released")


def applied(name: str | None, why: str) -> tuple:
    return SUCCESS, (NORMAL, APPLIED_REASON, f"sharing config {name!r} applied ({why})" if name else
                     f"sharing turned off ({why})")
