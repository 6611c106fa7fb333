"""GPU time-slices asked for by allocations: an allocation that time-slices a whole GPU the
node's sharing configuration does not share sets that GPU's interval (``nvidia-smi
compute-policy --set-timeslice``, as NVIDIA's DRA driver does); the latest such allocation's
interval is the GPU's, and when the last one goes the GPU is back at ``Default``.

``wanted`` is pure. ``apply`` changes only GPUs whose interval differs from the one this
module set last, which it keeps in the state folder (``timeslices.json``), so a restart
neither repeats the calls nor forgets to restore a GPU whose allocations went meanwhile. A
MIG device's time-slice cannot be set (the GPU's is its), so its allocations set none.
"""

from __future__ import annotations

import json
import logging

from ..fileio import ensure_dir, write_atomic

__all__ = ["wanted", "TimeSlices", "state_path"]

log = logging.getLogger("hostagent.daemon")

DEFAULT = "Default"


def state_path(host):
    return host.state_dir / "timeslices.json"


def wanted(allocations, gpus: set[str]) -> dict[str, str]:
    """GPU uuid -> interval: the latest time-slicing allocation's, for the GPUs (``gpus``)
    that allocations time-slice outside the sharing configuration."""
    out: dict[str, tuple[float, str]] = {}
    for a in allocations:
        if a.shared_as:
            continue                     # the sharing configuration sets its devices' interval
        for uuid in a.devices:
            sharing = a.sharing_of(uuid)
            if uuid in gpus and sharing["strategy"] == "TimeSlicing":
                interval = (sharing.get("timeSlicingConfig") or {}).get("interval", DEFAULT)
                if uuid not in out or out[uuid][0] <= a.created:
                    out[uuid] = (a.created, interval)
    return {u: interval for u, (_, interval) in out.items()}


class TimeSlices:
    """The intervals this module set, as its state file records them (read once)."""

    def __init__(self, host):
        self.host = host
        self._applied: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        if self._applied is None:
            try:
                self._applied = {str(k): str(v) for k, v in json.loads(state_path(self.host).read_text()).items()}
            except (OSError, ValueError, TypeError, AttributeError):
                self._applied = {}
        return self._applied

    def settled(self, want: dict[str, str]) -> bool:
        """Whether ``apply(want, ...)`` would read, run and write nothing (False until the
        state file has been read once)."""
        return self._applied is not None and self._applied == {u: i for u, i in want.items() if i != DEFAULT}

    def apply(self, want: dict[str, str], present: set[str]) -> list[tuple[str, str]]:
        """Worker: set the intervals that differ from the ones set last, restore ``Default``
        on GPUs no allocation time-slices any more (those still there: ``present``); the
        changes made. Nothing is read or run when nothing differs (every allocation asks)."""
        applied = self._load()
        want = {u: i for u, i in want.items() if i != DEFAULT}       # Default is what a GPU has unset
        if applied == want:
            return []
        from ..sharing.executor import set_interval
        before = dict(applied)
        changes = []
        try:
            for uuid in sorted(set(applied) | set(want)):
                target = want.get(uuid, DEFAULT)
                if applied.get(uuid, DEFAULT) == target or (uuid not in want and uuid not in present):
                    if uuid not in want:
                        applied.pop(uuid, None)
                    continue
                set_interval(self.host, uuid, target)
                changes.append((uuid, target))
                if target == DEFAULT:
                    applied.pop(uuid, None)
                else:
                    applied[uuid] = target
        finally:
            if applied != before:
                ensure_dir(state_path(self.host).parent, 0o755)
                write_atomic(state_path(self.host), json.dumps(applied, sort_keys=True) + "\n", mode=0o644)
        for uuid, interval in changes:
            log.info("GPU %s time-slice %s", uuid, interval, extra={"fields": {"device": uuid}})
        return changes
