"""Keeps the node's pool of ResourceSlices in the API server equal to what the plugin
publishes: one pool named after the node, its slices named ``<node>-<driver>-<nnn>``.

``sync(specs)`` lists the pool's slices and compares them with the wanted ones; when they
are the same (a restarted plugin, a restarted kubelet that kept them) nothing is written.
Otherwise every wanted slice is written with the next generation and the slice count, then
the slices no longer wanted are deleted: a consumer that sees only some slices of the new
generation finds the pool incomplete and waits, never mixing two generations.

An API server that drops fields it does not know (a feature gate off: ``sharedCounters``
and ``consumesCounters`` without ``DRAPartitionableDevices``) returns less than it was
given; the publisher remembers what came back for what it sent, so it does not rewrite the
same slices forever, and reports the dropped fields once.
"""

from __future__ import annotations

import hashlib
import json
import logging
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
    return sorted({p.split("[")[0] if "[" in p else p for p in out})


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

    def _owner(self) -> list[dict]:
        if not self.owner_uid:
            return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.owner_uid, "controller": True}]

    def _matches(self, wanted: dict, existing: dict) -> bool:
        spec = existing.get("spec") or {}
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
            return Outcome(top, 0, 0)
        generation = max(top, self.generation) + 1
        written = 0
        dropped: set[str] = set()
        for name, spec in zip(names, specs):
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": name, **({"ownerReferences": self._owner()} if self.owner_uid else {})},
                    "spec": {**spec, "pool": {**spec["pool"], "generation": generation,
                                              "resourceSliceCount": len(specs)}}}
            old = by_name.get(name)
            if old is not None:
                body["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                got = self.api.replace_slice(body)
            else:
                got = self.api.create_slice(body)
            written += 1
            kept = got.get("spec") or {}
            self._echo[_content(body["spec"])] = _content(kept)
            dropped.update(_dropped(body["spec"], kept))
        deleted = 0
        for name in sorted(set(by_name) - set(names)):
            self.api.delete_slice(name)
            deleted += 1
        if len(self._echo) > 4 * len(specs) + 16:
            self._echo = dict(list(self._echo.items())[-(2 * len(specs) + 8):])
        if sorted(dropped) != self.dropped and dropped:
            log.error("the API server dropped %s from the slices: enable the DRAPartitionableDevices feature gate, "
                      "or run without --dynamic-mig", ", ".join(sorted(dropped)))
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
