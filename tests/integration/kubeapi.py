"""A test Kubernetes API server: the parts of the API hostagent's plugins use (the DRA plugin,
the node controller), over HTTP on 127.0.0.1, for a real client (lightkube) to talk to.

- ResourceSlices: list and watch (field selectors ``spec.driver``, ``spec.nodeName``,
  ``spec.pool.name``), get, create (``generateName`` too), replace (``resourceVersion``
  checked: 409 on a stale one), delete. Every slice written is checked as the API server of
  ``version`` checks it: against Kubernetes' OpenAPI schema (``kubernetes-validate``,
  strict) and the limits of its validation code (``slice_problems``); a bad one is refused
  with 422 and kept in ``rejected``.
- ResourceClaims: get (tests put them in ``claims``); ``/version``.
- Nodes (and ``nodes/status``), Pods (and ``pods/eviction``), ConfigMaps, Events and Leases
  (``kubeobjects``): list and watch with label and field selectors, get, create, replace,
  merge and strategic merge patches, resourceVersions with 409 on a stale write, each object
  written checked against the schema of ``version``.
- Watches resume from a ``resourceVersion``; one older than ``compact()`` left is answered
  with 410 Gone (the ERROR event a real API server sends), as after an etcd compaction.
- ``partitionable=False``: the API server of a cluster whose DRAPartitionableDevices gate is
  off drops ``sharedCounters`` and ``consumesCounters`` from what it stores, as a real one does;
  ``device_taints`` (the DRADeviceTaints gate; by default on from 1.36, as Kubernetes has
  it) off drops the devices' ``taints``; on, a taint written without ``timeAdded`` gets the
  time of the write; ``defaulting``: it adds a field to each device (as a server's defaults do).
- ``stop()``/``start()`` on the same port: the API server away and back.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid as uuidlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

try:
    import kubernetes_validate
except ImportError:              # tests/kubelet_demo.py from the README's install: no schemas to check
    kubernetes_validate = None   # against (the test suite has them: [test])

from .kubeobjects import RESOURCES, Objects, field_selected, label_selected

__all__ = ["TestApiServer", "slice_problems", "kubeconfig"]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)$")
# /api/v1[/namespaces/NS]/RESOURCE[/NAME[/SUBRESOURCE]] and the same under /apis/GROUP/VERSION
OBJECT = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/([^/]+))?/([a-z]+)(?:/([^/]+))?(?:/([a-z]+))?$")


def _qualified(name: str) -> str | None:
    """Why ``name`` is not a qualified attribute or capacity name, or None."""
    domain, _, ident = name.rpartition("/")
    if domain and (len(domain) > 63 or not DNS_SUBDOMAIN.match(domain)):
        return f"{name}: the domain is not a DNS subdomain of at most 63 characters"
    if not C_IDENTIFIER.match(ident):
        return f"{name}: not a C identifier of at most 32 characters"
    return None


def slice_problems(spec: dict, version: tuple[int, int]) -> list[str]:
    """What ``pkg/apis/resource/validation`` refuses in a ResourceSlice spec (the checks a
    DRA plugin can get wrong), for an API server of ``version``."""
    out = []
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        out.append("spec.pool.name: required")
    if (pool.get("generation") or 0) < 0:
        out.append("spec.pool.generation: must not be negative")
    if (pool.get("resourceSliceCount") or 0) < 1:
        out.append("spec.pool.resourceSliceCount: must be more than 0")
    if sum(1 for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)) != 1:
        out.append("spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    devices = spec.get("devices") or []
    counter_sets = spec.get("sharedCounters") or []
    if version >= (1, 35) and spec.get("devices") is not None and spec.get("sharedCounters") is not None:
        out.append("spec: only one of sharedCounters or devices is allowed")
    consuming = any(d.get("consumesCounters") or d.get("taints") for d in devices)
    out += _taint_problems(devices, version)
    limit = 64 if consuming and version >= (1, 35) else 128
    if len(devices) > limit:
        out.append(f"spec.devices: {len(devices)} devices, more than {limit}")
    names = [d.get("name", "") for d in devices]
    for i, d in enumerate(devices):
        where = f"spec.devices[{i}]"
        if not DNS_LABEL.match(d.get("name", "")):
            out.append(f"{where}.name: {d.get('name')!r} is not a DNS label")
        attributes, capacity = d.get("attributes") or {}, d.get("capacity") or {}
        if len(attributes) + len(capacity) > 32:
            out.append(f"{where}: the total number of attributes and capacities must not exceed 32")
        for name, value in attributes.items():
            problem = _qualified(name)
            if problem:
                out.append(f"{where}.attributes[{problem}]")
            kinds = [k for k in ("int", "bool", "string", "version") if k in value]
            if len(kinds) != 1:
                out.append(f"{where}.attributes[{name}]: exactly one value")
            elif kinds[0] in ("string", "version") and len(value[kinds[0]]) > 64:
                out.append(f"{where}.attributes[{name}]: longer than 64")
            elif kinds[0] == "version" and not SEMVER.match(value["version"]):
                out.append(f"{where}.attributes[{name}]: {value['version']!r} is not a semantic version")
        for name in capacity:
            problem = _qualified(name)
            if problem:
                out.append(f"{where}.capacity[{problem}]")
        consumption = d.get("consumesCounters") or []
        if version >= (1, 35) and len(consumption) > 2:
            out.append(f"{where}.consumesCounters: more than 2")
        for c in consumption:
            if version < (1, 35) and c.get("counterSet") not in {s.get("name") for s in counter_sets}:
                out.append(f"{where}.consumesCounters: counter set {c.get('counterSet')!r} is not in the slice")
            if len(c.get("counters") or {}) > 32:
                out.append(f"{where}.consumesCounters: more than 32 counters")
            out += [f"{where}.consumesCounters: counter {n!r} is not a DNS label"
                    for n in c.get("counters") or {} if not DNS_LABEL.match(n)]
    if len(set(names)) != len(names):
        out.append("spec.devices: a device name twice")
    total = sum(len(s.get("counters") or {}) for s in counter_sets)
    if version < (1, 35) and total > 32:
        out.append(f"spec.sharedCounters: {total} counters, more than 32")
    if version >= (1, 35) and len(counter_sets) > 8:
        out.append(f"spec.sharedCounters: {len(counter_sets)} counter sets, more than 8")
    for s in counter_sets:
        if not DNS_LABEL.match(s.get("name", "")):
            out.append(f"spec.sharedCounters: {s.get('name')!r} is not a DNS label")
        if not s.get("counters"):
            out.append(f"spec.sharedCounters[{s.get('name')}].counters: required")
        if version >= (1, 35) and len(s.get("counters") or {}) > 32:
            out.append(f"spec.sharedCounters[{s.get('name')}]: more than 32 counters")
    return out


LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _taint_problems(devices: list[dict], version: tuple[int, int]) -> list[str]:
    """``validateDeviceTaint``: a label name for the key, a label value for the value, an
    effect of the version's (None from 1.35), at most 4 a device in 1.34 and 16 after."""
    out = []
    effects = {"NoSchedule", "NoExecute"} | ({"None"} if version >= (1, 35) else set())
    limit = 4 if version < (1, 35) else 16
    for i, d in enumerate(devices):
        taints = d.get("taints") or []
        if len(taints) > limit:
            out.append(f"spec.devices[{i}].taints: {len(taints)} taints, more than {limit}")
        for t in taints:
            where = f"spec.devices[{i}].taints[{t.get('key')}]"
            domain, _, name = (t.get("key") or "").rpartition("/")
            if not LABEL_VALUE.match(name) or not name or len(name) > 63 or \
                    (domain and (len(domain) > 253 or not DNS_SUBDOMAIN.match(domain))):
                out.append(f"{where}.key: not a label name")
            value = t.get("value") or ""
            if len(value) > 63 or not LABEL_VALUE.match(value):
                out.append(f"{where}.value: not a label value")
            if t.get("effect") not in effects:
                out.append(f"{where}.effect: Unsupported value: {t.get('effect')!r}: supported values: "
                           + ", ".join(f'"{e}"' for e in sorted(effects)))
    return out


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _selected(obj: dict, selector: str | None) -> bool:
    return field_selected(obj, selector)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY the second waits for the
    # client's delayed ACK (40 ms a request), which a real API server never makes anyone wait.
    disable_nagle_algorithm = True
    server: "_Server"

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def _route(self, method: str) -> None:
        api = self.server.api
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        api.requests.append((method, url.path, query))
        if api.failing:
            code = api.failing.pop(0)
            self._send(code, _status(code, "InternalError", "injected failure"))
            return
        try:
            body = self._body() if method in ("POST", "PUT", "PATCH") else None
            self.content_type = self.headers.get("Content-Type") or ""
            code, body = api.answer(method, url.path, query, body, self)
        except Exception as e:       # a bug in the test server: say so to the client
            code, body = 500, _status(500, "InternalError", f"test API server: {type(e).__name__}: {e}")
        if code:
            try:
                self._send(code, body)
            except OSError:          # the client went away (a killed process): nothing to answer
                self.close_connection = True

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_PUT(self):
        self._route("PUT")

    def do_DELETE(self):
        self._route("DELETE")

    def do_PATCH(self):
        self._route("PATCH")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def get_request(self):
        conn, address = super().get_request()
        self.connections.add(conn)
        return conn, address

    def shutdown_request(self, request):
        self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client that went away (a killed process) is no error of the server's."""
        import sys
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def drop_connections(self) -> None:
        """Kept-alive connections too: a stopped API server answers nothing more."""
        for conn in list(self.connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TestApiServer:
    __test__ = False

    def __init__(self, version: tuple[int, int] = (1, 34), partitionable: bool = True,
                 device_taints: bool | None = None):
        self.version = version
        self.partitionable = partitionable
        self.device_taints = version >= (1, 36) if device_taints is None else device_taints
        self.defaulting = False                # add a field a writer did not send (a server's default)
        self.slices: dict[str, dict] = {}
        self.claims: dict[tuple[str, str], dict] = {}
        self.nodes: dict[str, dict] = {}
        self.rejected: list[tuple[dict, list[str]]] = []
        self.requests: list[tuple[str, str, dict]] = []
        self.failing: list[int] = []           # statuses the next requests get
        self.writes = 0                        # slices created, replaced or deleted
        self._rv = 0
        self._events: list[tuple[int, str, str, dict]] = []      # (resourceVersion, resource, type, object)
        self.compacted = 0                     # watches from before this resourceVersion get 410 Gone
        self.objects = Objects(self._stamp, self._event, self._validate, self.nodes)
        self.objects.rejected = self.rejected
        self._cond = threading.Condition()
        self._server: _Server | None = None
        self._thread = None
        self.port = None

    # ---- life ---------------------------------------------------------------------

    def start(self) -> "TestApiServer":
        if self.port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        self._server = _Server(("127.0.0.1", self.port), _Handler)
        self._server.api = self
        self._server.connections = set()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.drop_connections()
            self._server = None
        with self._cond:
            self._cond.notify_all()

    @property
    def up(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        return kubeconfig(path, self.url)

    # ---- state ----------------------------------------------------------------------

    def _stamp(self, obj: dict, kind: str | None = None) -> dict:
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        meta.setdefault("uid", str(uuidlib.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        return obj

    def _event(self, kind: str, obj: dict, resource: str = "resourceslices") -> None:
        self._events.append((self._rv, resource, kind, json.loads(json.dumps(obj))))
        self._cond.notify_all()

    def compact(self) -> None:
        """Forget the changes so far, as etcd's compaction does: a watch resumed from before
        now is answered 410 Gone."""
        with self._cond:
            self.compacted = self._rv
            self._events = []

    def add_node(self, name: str, labels: dict | None = None) -> dict:
        with self._cond:
            meta = {"name": name, **({"labels": dict(labels)} if labels else {})}
            node = self._stamp({"apiVersion": "v1", "kind": "Node", "metadata": meta,
                                "spec": {}, "status": {"conditions": []}}, "Node")
            self.nodes[name] = node
            self._event("ADDED", node, "nodes")
            return node

    # ---- what tests and other clients do ------------------------------------------------

    def label_node(self, name: str, labels: dict) -> dict:
        """``kubectl label node``: each key set, or removed where its value is None."""
        with self._cond:
            code, obj = self.objects.patch("nodes", "", name, {"metadata": {"labels": labels}},
                                           "application/merge-patch+json")
            assert code == 200, obj
            return obj

    def patch(self, resource: str, name: str, patch: dict, namespace: str = "") -> dict:
        """A merge patch, as another client (an admin's kubectl) makes it."""
        with self._cond:
            code, obj = self.objects.patch(resource, namespace, name, patch, "application/merge-patch+json")
            assert code == 200, obj
            return obj

    def get(self, resource: str, name: str, namespace: str = "") -> dict | None:
        with self._cond:
            obj = self.objects.get(resource, namespace, name)
            return json.loads(json.dumps(obj)) if obj is not None else None

    def create(self, obj: dict) -> dict:
        """Create ``obj`` as a client would (checked, stamped, watched)."""
        resource = next(r for r, (_, kind, _) in RESOURCES.items() if kind == obj["kind"])
        with self._cond:
            code, out = self.objects.create(resource, obj["metadata"].get("namespace", ""), json.loads(json.dumps(obj)))
            assert code == 201, out
            return out

    def delete(self, resource: str, name: str, namespace: str = "") -> None:
        with self._cond:
            self.objects.delete(resource, namespace, name)

    def list(self, resource: str, namespace: str | None = None, labels: str | None = None,
             fields: str | None = None) -> list[dict]:
        with self._cond:
            return json.loads(json.dumps(self.objects.list(resource, namespace, labels, fields)))

    def events(self, node: str | None = None) -> list[dict]:
        """The Events recorded, about ``node`` when one is named."""
        fields = f"involvedObject.kind=Node,involvedObject.name={node}" if node else None
        return self.list("events", fields=fields)

    def condition(self, node: str, kind: str) -> dict | None:
        found = self.get("nodes", node) or {}
        return next((c for c in (found.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)

    def put_claim(self, claim: dict) -> dict:
        with self._cond:
            claim = self._stamp(json.loads(json.dumps(claim)), "ResourceClaim")
            m = claim["metadata"]
            self.claims[(m["namespace"], m["name"])] = claim
            return claim

    def delete_claim(self, namespace: str, name: str) -> None:
        with self._cond:
            self.claims.pop((namespace, name), None)

    def delete_slices(self, node: str) -> int:
        """What a starting kubelet does: delete every slice of the node."""
        with self._cond:
            gone = [n for n, s in self.slices.items() if s["spec"].get("nodeName") == node]
            for name in gone:
                self._rv += 1
                self._event("DELETED", self.slices.pop(name))
            return len(gone)

    def pool(self, driver: str, pool: str) -> list[dict]:
        """The slices of a pool at its highest generation, in name order."""
        with self._cond:
            found = [s for s in self.slices.values()
                     if s["spec"]["driver"] == driver and s["spec"]["pool"]["name"] == pool]
        top = max((s["spec"]["pool"]["generation"] for s in found), default=0)
        return sorted((s for s in found if s["spec"]["pool"]["generation"] == top),
                      key=lambda s: s["metadata"]["name"])

    def complete(self, driver: str, pool: str) -> bool:
        slices = self.pool(driver, pool)
        return bool(slices) and all(s["spec"]["pool"]["resourceSliceCount"] == len(slices) for s in slices)

    # ---- requests ---------------------------------------------------------------------

    def _validate(self, obj: dict) -> list[str]:
        """What the OpenAPI schema of this server's version says of ``obj`` (strict)."""
        if kubernetes_validate is None:
            return []
        try:
            kubernetes_validate.validate(obj, f"{self.version[0]}.{self.version[1]}", strict=True)
            return []
        except kubernetes_validate.ValidationError as e:
            return [f"schema: {e.message} at {'.'.join(str(p) for p in e.path)}"]

    def _check(self, obj: dict) -> list[str]:
        problems = self._validate(obj)
        problems += slice_problems(obj.get("spec") or {}, self.version)
        name = (obj.get("metadata") or {}).get("name") or ""
        if name and (len(name) > 253 or not DNS_SUBDOMAIN.match(name)):
            problems.append(f"metadata.name: {name!r} is not a DNS subdomain")
        return problems

    def _gated(self, obj: dict) -> dict:
        if self.defaulting:
            for d in obj["spec"].get("devices") or []:
                d.setdefault("allowMultipleAllocations", False)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for d in obj["spec"].get("devices") or []:
            if not self.device_taints:
                d.pop("taints", None)
            for t in d.get("taints") or []:
                t.setdefault("timeAdded", now)          # "Added automatically during create or update if not set"
        if self.partitionable:
            return obj
        spec = obj["spec"]
        spec.pop("sharedCounters", None)
        for d in spec.get("devices") or []:
            d.pop("consumesCounters", None)
        return obj

    def answer(self, method: str, path: str, query: dict, body, handler):
        if path == "/version":
            major, minor = self.version
            return 200, {"major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0"}
        m = CLAIM.match(path)
        if m and method == "GET":
            claim = self.claims.get((m.group(1), m.group(2)))
            if claim is None:
                return 404, _status(404, "NotFound", f'resourceclaims.resource.k8s.io "{m.group(2)}" not found')
            return 200, claim
        if path == SLICES:
            if method == "GET" and query.get("watch") == "true":
                self._watch(query, handler)
                return None, None
            if method == "GET":
                with self._cond:
                    items = [s for s in self.slices.values() if _selected(s, query.get("fieldSelector"))]
                    return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                                 "metadata": {"resourceVersion": str(self._rv)}, "items": items}
            if method == "POST":
                return self._create(body)
        if path.startswith(SLICES + "/"):
            name = path[len(SLICES) + 1:]
            with self._cond:
                if method == "GET":
                    s = self.slices.get(name)
                    return (200, s) if s else (404, _status(404, "NotFound", f"{name} not found"))
                if method == "DELETE":
                    s = self.slices.pop(name, None)
                    if s is None:
                        return 404, _status(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
                    self._rv += 1
                    self.writes += 1
                    self._event("DELETED", s)
                    return 200, _status(200, "", "deleted") | {"status": "Success"}
                if method == "PUT":
                    return self._replace(name, body)
        m = OBJECT.match(path)
        if m and m.group(2) in RESOURCES:
            with self._cond:
                return self._object(method, m.group(1), m.group(2), m.group(3), m.group(4), query, body, handler)
        return 404, _status(404, "NotFound", f"the test API server has no {method} {path}")

    def _object(self, method, namespace, resource, name, subresource, query, body, handler):
        """Requests for the objects of ``kubeobjects`` (under the lock)."""
        objects = self.objects
        ns = namespace or ""
        if RESOURCES[resource][2] != bool(namespace) and name is not None:
            return 404, _status(404, "NotFound", f"{resource}: the namespace is {'missing' if namespace else 'extra'}")
        if name is None:
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._cond.release()
                try:
                    self._watch(query, handler, resource, namespace)
                finally:
                    self._cond.acquire()
                return None, None
            if method == "GET":
                try:
                    items = objects.list(resource, namespace, query.get("labelSelector"), query.get("fieldSelector"))
                except ValueError as e:
                    return 400, _status(400, "BadRequest", str(e))
                api_version, kind, _ = RESOURCES[resource]
                return 200, {"apiVersion": api_version, "kind": f"{kind}List",
                             "metadata": {"resourceVersion": str(self._rv)}, "items": items}
            if method == "POST" and namespace or method == "POST" and not RESOURCES[resource][2]:
                return objects.create(resource, ns, body)
            return 405, _status(405, "MethodNotAllowed", f"{method} on the {resource} collection")
        allowed = {None: ("GET", "PUT", "PATCH", "DELETE"), "status": ("GET", "PUT", "PATCH"),
                   "eviction": ("POST",)}
        if subresource not in allowed or (subresource == "status" and resource not in ("nodes", "pods")) \
                or (subresource == "eviction" and resource != "pods") or method not in allowed[subresource]:
            return 405, _status(405, "MethodNotAllowed", f"{method} on {resource}/{subresource or ''}")
        if subresource == "eviction":
            return objects.evict(ns, name, body)
        if method == "GET":
            obj = objects.get(resource, ns, name)
            return (200, obj) if obj else (404, _status(404, "NotFound", f'{resource} "{name}" not found'))
        if method == "PUT":
            return objects.replace(resource, ns, name, body, subresource)
        if method == "PATCH":
            return objects.patch(resource, ns, name, body, handler.content_type, subresource)
        return objects.delete(resource, ns, name)

    def _create(self, body: dict):
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuidlib.uuid4().hex[:5]
        problems = self._check(body)
        if problems:
            self.rejected.append((body, problems))
            return 422, _status(422, "Invalid", "; ".join(problems))
        with self._cond:
            if meta["name"] in self.slices:
                return 409, _status(409, "AlreadyExists",
                                    f'resourceslices.resource.k8s.io "{meta["name"]}" already exists')
            obj = self._stamp(self._gated(body), "ResourceSlice")
            self.slices[meta["name"]] = obj
            self.writes += 1
            self._event("ADDED", obj)
            return 201, obj

    def _replace(self, name: str, body: dict):
        old = self.slices.get(name)
        if old is None:
            return 404, _status(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
        if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            return 409, _status(409, "Conflict", "the object has been modified; please apply your changes to the "
                                                 "latest version and try again")
        problems = self._check(body)
        for field in ("driver", "nodeName"):
            if body["spec"].get(field) != old["spec"].get(field):
                problems.append(f"spec.{field}: field is immutable")
        if body["spec"]["pool"]["name"] != old["spec"]["pool"]["name"]:
            problems.append("spec.pool.name: field is immutable")
        if problems:
            self.rejected.append((body, problems))
            return 422, _status(422, "Invalid", "; ".join(problems))
        body["metadata"]["uid"] = old["metadata"]["uid"]
        obj = self._stamp(self._gated(body), "ResourceSlice")
        self.slices[name] = obj
        self.writes += 1
        self._event("MODIFIED", obj)
        return 200, obj

    def _watch(self, query: dict, handler, resource: str = "resourceslices", namespace: str | None = None) -> None:
        selector = query.get("fieldSelector")
        labels = query.get("labelSelector")

        def selected(obj: dict) -> bool:
            return (_selected(obj, selector) and label_selected(obj, labels)
                    and (namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace))
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 300)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(kind, obj) -> None:
            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            handler.wfile.flush()
        try:
            with self._cond:
                since = query.get("resourceVersion")
                if since and since != "0" and int(since) < self.compacted:
                    send("ERROR", _status(410, "Expired", f"too old resource version: {since} ({self.compacted})"))
                    pending, position, deadline = [], self._rv, 0.0
                elif since and since != "0":
                    position = int(since)
                    pending = [(k, o) for rv, r, k, o in self._events if rv > position and r == resource and selected(o)]
                else:
                    position = self._rv
                    current = self.slices.values() if resource == "resourceslices" else \
                        self.objects.list(resource, namespace, None, None)
                    pending = [("ADDED", s) for s in current if selected(s)]
            for kind, obj in pending:
                send(kind, obj)
            while self.up and time.monotonic() < deadline:
                with self._cond:
                    self._cond.wait(0.2)
                    fresh = [(rv, r, k, o) for rv, r, k, o in self._events if rv > position]
                    if fresh:
                        position = fresh[-1][0]
                for _, r, kind, obj in fresh:
                    if r == resource and selected(obj):
                        send(kind, obj)
            handler.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        handler.close_connection = True


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig file naming ``server`` (plain HTTP, no credentials)."""
    path = Path(path)
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {}}]}))
    return path
