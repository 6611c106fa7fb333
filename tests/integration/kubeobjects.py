"""The test API server's plain objects: Nodes (and ``nodes/status``), Pods (and
``pods/eviction``), ConfigMaps, Events and Leases, kept as an API server keeps them.

- list with label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``k``, ``!k``) and
  field selectors (``=``, ``==``, ``!=`` on any dotted path: ``metadata.name``,
  ``spec.nodeName``, ``involvedObject.name``), across namespaces or in one;
- get, create (``generateName`` too; 409 AlreadyExists), replace (409 Conflict on a stale
  ``resourceVersion``), delete;
- patch: JSON merge patch (RFC 7386) and strategic merge patch (lists merged on the keys
  Kubernetes' types declare: conditions by ``type``, containers by ``name``, ...); a
  ``metadata.resourceVersion`` in the patch is a precondition (409 when stale), as the API
  server has it; ``nodes/status`` changes only the status;
- ``pods/eviction``: a policy/v1 Eviction deletes the pod, unless a disruption budget
  forbids it (``blocked``: 429, as many times as a test says, or always);
- every object written is checked against Kubernetes' OpenAPI schema of the server's
  version (``kubernetes-validate``, strict): a bad one is refused with 422 and kept in
  ``rejected``.

The watch itself (resumed from a ``resourceVersion``, 410 Gone before the oldest one kept)
is the server's (``kubeapi``): every change here is an event there.
"""

from __future__ import annotations

import copy
import re
import time
import uuid as uuidlib

__all__ = ["RESOURCES", "Objects", "label_selected", "field_selected", "merge_patch", "strategic_patch", "status"]

# resource -> (apiVersion, kind, namespaced)
RESOURCES = {
    "nodes": ("v1", "Node", False),
    "pods": ("v1", "Pod", True),
    "configmaps": ("v1", "ConfigMap", True),
    "events": ("v1", "Event", True),
    "leases": ("coordination.k8s.io/v1", "Lease", True),
}
# Lists a strategic merge patch merges by key (patchMergeKey in k8s.io/api); others are replaced.
MERGE_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name", "volumes": "name",
              "env": "name", "ports": "containerPort", "addresses": "type", "volumeMounts": "mountPath",
              "tolerations": None}


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _path(obj: dict, dotted: str):
    value = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _terms(selector: str) -> list[str]:
    """The selector's terms, split on the commas outside parentheses."""
    out, depth, term = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(term.strip())
            term = ""
        else:
            term += ch
    return [t for t in out + [term.strip()] if t]


def field_selected(obj: dict, selector: str | None) -> bool:
    for term in _terms(selector or ""):
        m = re.fullmatch(r"([^!=]+)(==|!=|=)(.*)", term)
        if not m:
            raise ValueError(f"invalid field selector term {term!r}")
        value = _path(obj, m.group(1).strip())
        value = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        if (value == m.group(3)) != (m.group(2) != "!="):
            return False
    return True


def label_selected(obj: dict, selector: str | None) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in _terms(selector or ""):
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            inside = labels.get(m.group(1)) in values
            if inside != (m.group(2) == "in"):
                return False
            continue
        m = re.fullmatch(r"([^!=]+)(==|!=|=)(.*)", term)
        if m:
            have = labels.get(m.group(1).strip())
            if (have == m.group(3).strip()) != (m.group(2) != "!="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target, patch):
    """RFC 7386: objects merge, ``null`` removes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_patch(target, patch, key: str | None = None):
    """A strategic merge patch: a merge patch whose lists named in MERGE_KEYS merge item by
    item on their key (``$patch: delete`` removes one)."""
    if isinstance(patch, list) and key in MERGE_KEYS and MERGE_KEYS[key] and isinstance(target, list):
        merge_key = MERGE_KEYS[key]
        out = [copy.deepcopy(t) for t in target]
        for item in patch:
            at = next((i for i, t in enumerate(out) if t.get(merge_key) == item.get(merge_key)), None)
            if item.get("$patch") == "delete":
                if at is not None:
                    out.pop(at)
            elif at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = strategic_patch(out[at], item)
        return out
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, value in patch.items():
        if value is None:
            out.pop(k, None)
        else:
            out[k] = strategic_patch(out.get(k), value, k)
    return out


class Objects:
    """The objects of RESOURCES, by resource and (namespace, name) (namespace "" for a
    cluster-scoped one), for the server's lock holder to change. ``stamp`` and ``event``
    are the server's: the next resourceVersion, and the watch's record of a change."""

    def __init__(self, stamp, event, validate, nodes: dict):
        self._stamp = stamp
        self._event = event
        self._validate = validate
        self.nodes = nodes                   # the server's own dict of nodes, by name
        self.store: dict[str, dict] = {r: {} for r in RESOURCES if r != "nodes"}
        self.rejected: list[tuple[dict, list[str]]] = []
        self.blocked: dict[tuple[str, str], int | None] = {}   # pod -> 429s still to answer (None: always)
        self.evicted: list[tuple[str, str]] = []
        self.on_delete: list = []            # called with (resource, object) after each delete

    # ---- the store ---------------------------------------------------------------------

    def _items(self, resource: str) -> dict:
        if resource == "nodes":
            return {("", k): v for k, v in self.nodes.items()}
        return self.store[resource]

    def get(self, resource: str, namespace: str, name: str) -> dict | None:
        if resource == "nodes":
            return self.nodes.get(name)
        return self.store[resource].get((namespace, name))

    def _put(self, resource: str, obj: dict) -> None:
        meta = obj["metadata"]
        if resource == "nodes":
            self.nodes[meta["name"]] = obj
        else:
            self.store[resource][(meta.get("namespace", ""), meta["name"])] = obj

    def _pop(self, resource: str, namespace: str, name: str) -> dict | None:
        if resource == "nodes":
            return self.nodes.pop(name, None)
        return self.store[resource].pop((namespace, name), None)

    def list(self, resource: str, namespace: str | None, labels: str | None, fields: str | None) -> list[dict]:
        return [o for (ns, _), o in sorted(self._items(resource).items(), key=lambda kv: kv[0])
                if (namespace is None or ns == namespace) and label_selected(o, labels) and field_selected(o, fields)]

    # ---- writes --------------------------------------------------------------------------

    def _checked(self, resource: str, obj: dict):
        """None when ``obj`` may be stored, else the 422 answer (kept in ``rejected``)."""
        api_version, kind, _ = RESOURCES[resource]
        if obj.get("apiVersion") != api_version or obj.get("kind") != kind:
            problems = [f"apiVersion/kind: {obj.get('apiVersion')}/{obj.get('kind')} is not {api_version}/{kind}"]
        else:
            problems = self._validate(obj)
        if problems:
            self.rejected.append((copy.deepcopy(obj), problems))
            return 422, status(422, "Invalid", "; ".join(problems))
        return None

    def create(self, resource: str, namespace: str, body: dict):
        meta = body.setdefault("metadata", {})
        if RESOURCES[resource][2]:
            if meta.setdefault("namespace", namespace) != namespace:
                return 400, status(400, "BadRequest", "the namespace of the object does not match the request's")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuidlib.uuid4().hex[:5]
        if not meta.get("name"):
            return 422, status(422, "Invalid", "metadata.name: Required value")
        if self.get(resource, namespace, meta["name"]) is not None:
            return 409, status(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists')
        meta.pop("resourceVersion", None)
        refused = self._checked(resource, body)
        if refused:
            return refused
        obj = self._stamp(body)
        self._put(resource, obj)
        self._event("ADDED", obj, resource)
        return 201, obj

    def _conflict(self, resource: str, name: str) -> tuple:
        return 409, status(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object has '
                                            "been modified; please apply your changes to the latest version and try "
                                            "again")

    def _store_update(self, resource: str, old: dict, new: dict):
        new.setdefault("metadata", {})
        for kept in ("uid", "creationTimestamp", "name", "namespace"):
            if kept in old["metadata"]:
                new["metadata"][kept] = old["metadata"][kept]
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return 200, old                  # no change: no new resourceVersion, no event
        refused = self._checked(resource, new)
        if refused:
            return refused
        obj = self._stamp(new)
        self._put(resource, obj)
        self._event("MODIFIED", obj, resource)
        return 200, obj

    def replace(self, resource: str, namespace: str, name: str, body: dict, subresource: str | None = None):
        old = self.get(resource, namespace, name)
        if old is None:
            return 404, status(404, "NotFound", f'{resource} "{name}" not found')
        given = (body.get("metadata") or {}).get("resourceVersion")
        if given != old["metadata"]["resourceVersion"]:
            return self._conflict(resource, name)
        if subresource == "status":
            body = {**copy.deepcopy(old), "status": body.get("status")}
        return self._store_update(resource, old, copy.deepcopy(body))

    def patch(self, resource: str, namespace: str, name: str, patch: dict, content_type: str,
              subresource: str | None = None):
        old = self.get(resource, namespace, name)
        if old is None:
            return 404, status(404, "NotFound", f'{resource} "{name}" not found')
        if not isinstance(patch, dict):
            return 400, status(400, "BadRequest", "the patch is not an object")
        precondition = (patch.get("metadata") or {}).get("resourceVersion")
        if precondition is not None and precondition != old["metadata"]["resourceVersion"]:
            return self._conflict(resource, name)
        if "strategic-merge-patch" in content_type:
            new = strategic_patch(old, patch)
        elif "merge-patch" in content_type:
            new = merge_patch(old, patch)
        else:
            return 415, status(415, "UnsupportedMediaType", f"the test API server does not take {content_type}")
        if subresource == "status":
            new = {**copy.deepcopy(old), "status": new.get("status")}
        elif resource == "nodes" and new.get("status") != old.get("status"):
            new["status"] = copy.deepcopy(old.get("status"))   # the main resource ignores the status
        return self._store_update(resource, old, new)

    def delete(self, resource: str, namespace: str, name: str):
        obj = self._pop(resource, namespace, name)
        if obj is None:
            return 404, status(404, "NotFound", f'{resource} "{name}" not found')
        self._stamp(obj)
        self._event("DELETED", obj, resource)
        for listener in list(self.on_delete):
            listener(resource, obj)
        return 200, obj

    def evict(self, namespace: str, name: str, body: dict):
        """POST pods/<name>/eviction (policy/v1)."""
        if body.get("apiVersion") != "policy/v1" or body.get("kind") != "Eviction":
            return 400, status(400, "BadRequest", "an Eviction of policy/v1 is expected")
        problems = self._validate(body)
        if not problems and (body.get("metadata") or {}).get("name") != name:
            problems = ["metadata.name: the Eviction's name is not the pod's"]
        if problems:
            self.rejected.append((copy.deepcopy(body), problems))
            return 422, status(422, "Invalid", "; ".join(problems))
        if self.get("pods", namespace, name) is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found')
        key = (namespace, name)
        if key in self.blocked:
            left = self.blocked[key]
            if left is None or left > 0:
                if left is not None:
                    self.blocked[key] = left - 1
                return 429, status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                                           "disruption budget.")
        self.evicted.append(key)
        self.delete("pods", namespace, name)
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
