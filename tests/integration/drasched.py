"""A small DRA scheduler for tests: allocates a ResourceClaim from the ResourceSlices in the
test API server as Kubernetes' structured allocator does, for the parts NVIDIA's demo
claims use.

- Only complete pools count (every slice of the highest generation there, as many as
  ``resourceSliceCount`` says); devices are tried in slice-name order, then list order
  (first fit).
- A request (``exactly``: a DeviceClass, CEL selectors, ``count``, ``allocationMode``
  ``ExactCount`` or ``All``) takes devices that every selector of its class and its own
  select; a CEL runtime error (an attribute a device lacks) fails the claim, as it does in
  Kubernetes. CEL is evaluated by ``cel-python`` with Kubernetes' ``lowerAscii`` and
  ``upperAscii``; ``version`` attributes are strings and capacities integers here.
- ``matchAttribute`` constraints: the devices of the requests they name share the value.
- A device in another claim's allocation is taken; so are counters (KEP 4815): a device that
  consumes more of a counter set than is left is passed over.
- Device taints (KEP 5055): a device with a ``NoSchedule`` or ``NoExecute`` taint that the
  request's ``tolerations`` do not tolerate is passed over (``None``, and effects it does not
  know, are information only); a result lists the request's tolerations.
- The result: ``status.allocation`` with the results, the class configs (``FromClass``) and
  the claim's (``FromClaim``), and the node selector.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import celpy
import yaml
from celpy import celtypes

from hostagent.plugins.dra.quantity import parse_quantity

__all__ = ["Scheduler", "Unschedulable", "DEVICE_CLASSES"]

# The DeviceClasses hostagent ships (NVIDIA's, packaging/kubernetes/dra).
DEVICE_CLASSES = {d["metadata"]["name"]: d for d in yaml.safe_load_all(
    (Path(__file__).resolve().parents[2] / "packaging/kubernetes/dra/deviceclasses.yaml").read_text()) if d}

_FUNCTIONS = {"lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
              "upperAscii": lambda s: celtypes.StringType(str(s).upper())}


class Unschedulable(Exception):
    pass


@functools.lru_cache(maxsize=256)
def _program(expression: str):
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=_FUNCTIONS)


def _qualified(name: str, driver: str) -> tuple[str, str]:
    domain, _, ident = name.rpartition("/")
    return (domain or driver), ident


def _activation(device: dict, driver: str) -> dict:
    attributes: dict[str, dict] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, ident = _qualified(name, driver)
        attributes.setdefault(domain, {})[ident] = next(iter(value.values()))
    capacity: dict[str, dict] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, ident = _qualified(name, driver)
        capacity.setdefault(domain, {})[ident] = parse_quantity(value["value"])
    return {"device": celpy.json_to_cel({"driver": driver, "attributes": attributes, "capacity": capacity})}


def selected(expression: str, device: dict, driver: str) -> bool:
    """Whether a CEL selector selects the device; Unschedulable on a runtime error."""
    try:
        return bool(_program(expression).evaluate(_activation(device, driver)))
    except celpy.CELEvalError as e:
        raise Unschedulable(f"CEL runtime error in {expression!r} for device {device['name']}: {e.args[0]}") from None


class _Candidate:
    def __init__(self, driver, pool, device, sets):
        self.driver, self.pool, self.device = driver, pool, device
        self.sets = sets                  # counter set name -> counters (pool-wide)

    @property
    def key(self):
        return self.driver, self.pool, self.device["name"]

    def attribute(self, qualified: str):
        domain, ident = qualified.rsplit("/", 1)
        for name, value in (self.device.get("attributes") or {}).items():
            if _qualified(name, self.driver) == (domain, ident):
                return next(iter(value.values()))
        return None


class Scheduler:
    def __init__(self, api, classes: dict | None = None):
        self.api = api
        self.classes = dict(DEVICE_CLASSES if classes is None else classes)

    def _candidates(self) -> list[_Candidate]:
        out = []
        pools = {(s["spec"]["driver"], s["spec"]["pool"]["name"]) for s in self.api.slices.values()}
        for driver, pool in sorted(pools):
            if not self.api.complete(driver, pool):
                continue
            slices = self.api.pool(driver, pool)
            sets = {c["name"]: {k: parse_quantity(v["value"]) for k, v in c["counters"].items()}
                    for s in slices for c in s["spec"].get("sharedCounters") or []}
            out += [_Candidate(driver, pool, d, sets) for s in slices for d in s["spec"].get("devices") or []]
        return out

    def _in_use(self, skip_uid: str) -> tuple[set, dict]:
        """Devices in other claims' allocations, and the counters their devices consume."""
        taken, used = set(), {}
        by_key = {c.key: c for c in self._candidates()}
        for claim in self.api.claims.values():
            if claim["metadata"]["uid"] == skip_uid:
                continue
            for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
                key = (r["driver"], r["pool"], r["device"])
                taken.add(key)
                c = by_key.get(key)
                for consumption in (c.device.get("consumesCounters") or []) if c else []:
                    for name, value in consumption["counters"].items():
                        k = (c.driver, c.pool, consumption["counterSet"], name)
                        used[k] = used.get(k, 0) + parse_quantity(value["value"])
        return taken, used

    def _fits(self, c: _Candidate, used: dict) -> bool:
        for consumption in c.device.get("consumesCounters") or []:
            counters = c.sets.get(consumption["counterSet"])
            if counters is None:
                return False
            for name, value in consumption["counters"].items():
                k = (c.driver, c.pool, consumption["counterSet"], name)
                if name not in counters or used.get(k, 0) + parse_quantity(value["value"]) > counters[name]:
                    return False
        return True

    @staticmethod
    def _consume(c: _Candidate, used: dict) -> dict:
        used = dict(used)
        for consumption in c.device.get("consumesCounters") or []:
            for name, value in consumption["counters"].items():
                k = (c.driver, c.pool, consumption["counterSet"], name)
                used[k] = used.get(k, 0) + parse_quantity(value["value"])
        return used

    @staticmethod
    def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
        """``DeviceToleration.ToleratesTaint``: the effect (empty: any), the key (empty with
        Exists: any), the value (Equal, the default, compares it)."""
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            return True
        for t in tolerations:
            if t.get("effect") and t["effect"] != taint["effect"]:
                continue
            if t.get("key") and t["key"] != taint["key"]:
                continue
            operator = t.get("operator") or "Equal"
            if operator == "Exists" or (t.get("key") and (t.get("value") or "") == (taint.get("value") or "")):
                return True
        return False

    def _matching(self, request: dict, candidates: list[_Candidate]) -> list[_Candidate]:
        exactly = request.get("exactly")
        if exactly is None:
            raise Unschedulable(f"request {request['name']}: only 'exactly' requests are supported here")
        cls = self.classes.get(exactly["deviceClassName"])
        if cls is None:
            raise Unschedulable(f"request {request['name']}: no DeviceClass {exactly['deviceClassName']!r}")
        expressions = [s["cel"]["expression"] for s in (cls["spec"].get("selectors") or [])]
        expressions += [s["cel"]["expression"] for s in exactly.get("selectors") or []]
        tolerations = exactly.get("tolerations") or []
        return [c for c in candidates
                if all(self._tolerated(t, tolerations) for t in c.device.get("taints") or ())
                and all(selected(e, c.device, c.driver) for e in expressions)]

    def allocate(self, claim: dict, node: str) -> dict:
        """The claim with ``status.allocation`` (stored in the API server); Unschedulable when
        no set of free devices satisfies it."""
        spec = claim["spec"]["devices"]
        uid = claim["metadata"].get("uid", "")
        taken, used = self._in_use(uid)
        free = [c for c in self._candidates() if c.key not in taken]
        requests = spec.get("requests") or []
        options = []
        for request in requests:
            matching = self._matching(request, free)
            mode = request["exactly"].get("allocationMode", "ExactCount")
            count = len(matching) if mode == "All" else request["exactly"].get("count", 1)
            options.append((request["name"], matching, count))
        constraints = spec.get("constraints") or []
        chosen = self._search(options, [], set(), used, constraints)
        if chosen is None:
            raise Unschedulable(f"claim {claim['metadata'].get('name')}: no free devices satisfy it")
        configs = []
        for request in requests:
            cls = self.classes[request["exactly"]["deviceClassName"]]
            configs += [{"source": "FromClass", "requests": [request["name"]], **c}
                        for c in cls["spec"].get("config") or []]
        configs += [{"source": "FromClaim", **c} for c in spec.get("config") or []]
        out = copy.deepcopy(claim)
        tolerations = {r["name"]: r["exactly"].get("tolerations") for r in requests}
        out.setdefault("status", {})["allocation"] = {
            "devices": {"results": [{"request": name, "driver": c.driver, "pool": c.pool, "device": c.device["name"],
                                     **({"tolerations": tolerations[name]} if tolerations[name] else {})}
                                    for name, c in chosen],
                        **({"config": configs} if configs else {})},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
        return self.api.put_claim(out)

    def _search(self, options, chosen, keys, used, constraints):
        """Depth first over the requests' devices, first fit; the constraints checked as
        each device is added."""
        if not options:
            return chosen
        name, matching, count = options[0]
        picked = [c for n, c in chosen if n == name]
        if len(picked) == count:
            return self._search(options[1:], chosen, keys, used, constraints)
        for c in matching:
            if c.key in keys or not self._fits(c, used):
                continue
            trial = chosen + [(name, c)]
            if not self._constrained(trial, constraints):
                continue
            found = self._search(options, trial, keys | {c.key}, self._consume(c, used), constraints)
            if found is not None:
                return found
        return None

    @staticmethod
    def _constrained(chosen, constraints) -> bool:
        for constraint in constraints:
            attribute = constraint.get("matchAttribute")
            if not attribute:
                continue
            names = set(constraint.get("requests") or [])
            values = [c.attribute(attribute) for n, c in chosen if not names or n in names]
            if None in values or len(set(values)) > 1:
                return False
        return True

    def deallocate(self, claim: dict) -> dict:
        out = copy.deepcopy(claim)
        (out.get("status") or {}).pop("allocation", None)
        return self.api.put_claim(out)
