"""Keeps the node's pool of ResourceSlices in the API server equal to what the plugin
publishes: one pool named after the node, its slices named ``<node>-<driver>-<nnn>``.

``sync(specs)`` lists the pool's slices and compares them with the wanted ones; when they
are the same (a restarted plugin, a restarted kubelet that kept them) nothing is written.
Otherwise every wanted slice is written with the next generation and the slice count, then
the slices no longer wanted are deleted: a consumer that sees only some slices of the new
generation finds the pool incomplete and waits, never mixing two generations.

An API server that drops fields it does not know (a feature gate off: ``sharedCounters``
and ``consumesCounters`` without ``DRAPartitionableDevices``, ``taints`` without
``DRADeviceTaints``) returns less than it was given; the publisher remembers what came back
for what it sent, so it does not rewrite the same slices forever, and reports the dropped
fields once (``taints_dropped``: the plugin leaves taints out from then on).

A device's taint that stays from one write to the next keeps its ``timeAdded`` (the API
server sets it on a taint written without one), as Kubernetes' own ResourceSlice
controller keeps it: a toleration's ``tolerationSeconds`` counts from when the problem
began, not from the last write of the slice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass

from .errors import KubeError

__all__ = ["Publisher", "slice_prefix", "Outcome"]

log = logging.getLogger("hostagent.plugins")


def slice_prefix(node: str, driver: str) -> str:
    base = f"{node}-{driver}"
    if len(base) > 240:        # a name is at most 253 characters
        base = f"{base[:223]}-{hashlib.sha256(base.encode()).hexdigest()[:16]}"
    return base


def _content(spec: dict) -> str:
    """A slice's spec without the pool's generation and count, as comparable text."""
    pool = {k: v for k, v in (spec.get("pool") or {}).items() if k not in ("generation", "resourceSliceCount")}
    rest = {k: v for k, v in spec.items() if k != "pool" and v not in (None, [], {})}
    return json.dumps({**rest, "pool": pool}, sort_keys=True, separators=(",", ":"))


def _covers(have, want) -> bool:
    """Whether ``have`` (what the API server keeps) holds everything ``want`` says, fields the
    server adds (defaults) aside."""
    if isinstance(want, dict):
        # An empty value and an absent one are the same (the server leaves empty ones out).
        return isinstance(have, dict) and all(
            v is None or (_covers(have[k], v) if k in have else v in ([], {})) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(_covers, have, want))
    return have == want


def _dropped(sent: dict, got: dict, path: str = "spec") -> list[str]:
    """Fields of ``sent`` that ``got`` lacks (what the API server dropped)."""
    out = []
    if isinstance(sent, dict):
        for k, v in sent.items():
            if v in (None, [], {}):
                continue
            if not isinstance(got, dict) or k not in got or got[k] in (None, [], {}):
                out.append(f"{path}.{k}")
            else:
                out += _dropped(v, got[k], f"{path}.{k}")
    elif isinstance(sent, list) and isinstance(got, list):
        for i, (a, b) in enumerate(zip(sent, got)):
            out += _dropped(a, b, f"{path}[{i}]")
    return sorted({re.sub(r"\[\d+\]", "", p) for p in out})


def _taints(spec: dict) -> list:
    """Each device's taints without their times, to compare."""
    return [(d.get("name"), [(t.get("key"), t.get("value"), t.get("effect")) for t in d.get("taints") or ()])
            for d in spec.get("devices") or ()]


def _taint_times(slices: list[dict]) -> dict[tuple, str]:
    """(device, key, value, effect) -> timeAdded of each taint the pool's slices hold."""
    return {(d.get("name"), t.get("key"), t.get("value"), t.get("effect")): t["timeAdded"]
            for s in slices for d in (s.get("spec") or {}).get("devices") or ()
            for t in d.get("taints") or () if t.get("timeAdded")}


def _with_times(spec: dict, times: dict[tuple, str]) -> dict:
    """``spec`` with the ``timeAdded`` of each taint the pool already has."""
    if not any(d.get("taints") for d in spec.get("devices") or ()):
        return spec
    devices = []
    for d in spec["devices"]:
        if d.get("taints"):
            d = {**d, "taints": [{**t, **({"timeAdded": times[k]} if k in times else {})}
                                 for t in d["taints"]
                                 for k in [(d["name"], t.get("key"), t.get("value"), t.get("effect"))]]}
        devices.append(d)
    return {**spec, "devices": devices}


@dataclass(frozen=True)
class Outcome:
    generation: int
    written: int              # slices created or updated
    deleted: int

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


class Publisher:
    def __init__(self, api, driver: str, node: str, owner_uid: str | None = None):
        self.api = api
        self.driver = driver
        self.node = node
        self.pool = node
        self.prefix = slice_prefix(node, driver)
        self.owner_uid = owner_uid
        self.generation = 0
        self._echo: dict[str, str] = {}       # content sent -> content the server kept of it
        self.dropped: list[str] = []          # fields the API server dropped, last write
        self.taints_dropped = False           # it dropped the devices' taints (DRADeviceTaints off)

    def _owner(self) -> list[dict]:
        if not self.owner_uid:
            return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.owner_uid, "controller": True}]

    def _matches(self, wanted: dict, existing: dict) -> bool:
        spec = existing.get("spec") or {}
        if _taints(spec) != _taints(wanted) and not self.taints_dropped:
            return False                # a taint gone is a change (the server adds none of its own)
        want = {k: v for k, v in wanted.items() if k != "pool"}
        if _covers(spec, want) and (spec.get("pool") or {}).get("name") == wanted["pool"]["name"]:
            return True
        return self._echo.get(_content(wanted)) == _content(spec)

    def sync(self, specs: list[dict]) -> Outcome:
        """Make the pool's slices ``specs`` (generation and count filled in). Raises KubeError."""
        existing = [s for s in self.api.list_slices(self.driver, self.node)
                    if ((s.get("spec") or {}).get("pool") or {}).get("name") == self.pool]
        by_name = {s["metadata"]["name"]: s for s in existing}
        names = [f"{self.prefix}-{i:03d}" for i in range(len(specs))]
        generations = {((s["spec"].get("pool") or {}).get("generation") or 0) for s in existing}
        top = max(generations, default=0)
        current = (set(by_name) == set(names) and len(generations) == 1
                   and all((by_name[n]["spec"]["pool"].get("resourceSliceCount") == len(specs)
                            and self._matches(spec, by_name[n])) for n, spec in zip(names, specs)))
        if current:
            self.generation = top
            log.debug("pool %s of %s: generation %d unchanged", self.pool, self.driver, top)
            return Outcome(top, 0, 0)
        generation = max(top, self.generation) + 1
        written = 0
        dropped: set[str] = set()
        times = _taint_times(existing)
        for name, spec in zip(names, specs):
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": name, **({"ownerReferences": self._owner()} if self.owner_uid else {})},
                    "spec": {**_with_times(spec, times), "pool": {**spec["pool"], "generation": generation,
                                                                 "resourceSliceCount": len(specs)}}}
            old = by_name.get(name)
            if old is not None:
                body["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                got = self.api.replace_slice(body)
            else:
                got = self.api.create_slice(body)
            written += 1
            kept = got.get("spec") or {}
            self._echo[_content({**spec, "pool": body["spec"]["pool"]})] = _content(kept)
            dropped.update(_dropped(body["spec"], kept))
        deleted = 0
        for name in sorted(set(by_name) - set(names)):
            self.api.delete_slice(name)
            deleted += 1
        if len(self._echo) > 4 * len(specs) + 16:
            self._echo = dict(list(self._echo.items())[-(2 * len(specs) + 8):])
        taints = sorted(f for f in dropped if f.endswith(".taints"))
        counters = sorted(dropped - set(taints))
        if counters and counters != [f for f in self.dropped if not f.endswith(".taints")]:
            log.error("the API server dropped %s from the slices: enable the DRAPartitionableDevices feature gate, "
                      "or run without --dynamic-mig", ", ".join(counters))
        if taints and not self.taints_dropped:
            log.warning("the API server dropped the devices' taints (spec.devices.taints): its DRADeviceTaints "
                        "feature gate is off (on by default from Kubernetes 1.36); unhealthy devices are published "
                        "without taints, their health still reaches the kubelet (restart the plugin once the gate "
                        "is on)")
            self.taints_dropped = True
        self.dropped = sorted(dropped)
        self.generation = generation
        log.info("pool %s of %s: generation %d, %d slice(s) written, %d deleted", self.pool, self.driver, generation,
                 written, deleted)
        return Outcome(generation, written, deleted)

    def remove(self) -> int:
        """Delete the pool's slices (the plugin is uninstalled); the number deleted."""
        deleted = 0
        for s in self.api.list_slices(self.driver, self.node):
            try:
                self.api.delete_slice(s["metadata"]["name"])
                deleted += 1
            except KubeError as e:
                log.warning("%s", e.message)
        return deleted
