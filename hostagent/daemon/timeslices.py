"""GPU time-slices asked for by allocations: an allocation that time-slices a whole GPU the
node's sharing configuration does not share sets that GPU's interval (``nvidia-smi
compute-policy --set-timeslice``, as NVIDIA's DRA driver does); the latest such allocation's
interval is the GPU's, and when the last one goes the GPU is back at ``Default``.

``wanted`` is pure. ``apply`` changes only GPUs whose interval differs from the one this
module set last, which it keeps in the state folder (``timeslices.json``), so a restart
neither repeats the calls nor forgets to restore a GPU whose allocations went meanwhile. A
MIG device's time-slice cannot be set (the GPU's is its), so its allocations set none.

A state file that cannot be read is never taken for an empty one in silence: it is kept as
it was beside it (``timeslices.json.unreadable-<time>``), the intervals that can still be
read from it (a GPU's UUID and an interval name) are kept and written back, and the rest is
logged as an error: a GPU whose interval was lost this way keeps it until set by hand.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time

from ..fileio import ensure_dir, write_atomic
from ..sharing.config import INTERVALS

__all__ = ["wanted", "TimeSlices", "state_path"]

log = logging.getLogger("hostagent.daemon")

DEFAULT = "Default"
_PAIR = re.compile(rb'"(GPU-[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12})"\s*:\s*"(' +
                   "|".join(INTERVALS).encode() + rb')"')


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
            self._applied = self._read()
        return self._applied

    def _read(self) -> dict[str, str]:
        path = state_path(self.host)
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.error("time-slices state %s cannot be read (%s): the intervals allocations set are unknown, so "
                      "none is restored to Default when they go", path, e.strerror or e)
            return {}
        try:
            raw = json.loads(text)
            if isinstance(raw, dict) and all(isinstance(v, str) and v in INTERVALS for v in raw.values()):
                return dict(raw)
            why = "not a GPU-to-interval map"
        except ValueError as e:
            why = f"not JSON: {e}"
        kept = {u.decode(): i.decode() for u, i in _PAIR.findall(text)}
        aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.link(path, aside)
        except OSError:
            aside = path                 # not kept beside it: not rewritten either
        else:
            write_atomic(path, json.dumps(kept, sort_keys=True) + "\n", mode=0o644)
        log.error("time-slices state %s cannot be read (%s); kept as %s; the intervals read from it: %s; a GPU "
                  "whose interval allocations set is not among them keeps it when they go (nvidia-smi "
                  "compute-policy --set-timeslice 0 sets Default again)", path, why, aside,
                  ", ".join(f"{u} {i}" for u, i in sorted(kept.items())) or "none",
                  extra={"fields": {"state": str(aside)}})
        return kept

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
