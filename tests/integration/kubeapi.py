"""A test Kubernetes API server: the part of ``resource.k8s.io/v1`` a DRA plugin uses, over
HTTP on 127.0.0.1, for a real client (lightkube) to talk to.

- ResourceSlices: list and watch (field selectors ``spec.driver``, ``spec.nodeName``,
  ``spec.pool.name``), get, create (``generateName`` too), replace (``resourceVersion``
  checked: 409 on a stale one), delete. Every slice written is checked as the API server of
  ``version`` checks it: against Kubernetes' OpenAPI schema (``kubernetes-validate``,
  strict) and the limits of its validation code (``slice_problems``); a bad one is refused
  with 422 and kept in ``rejected``.
- ResourceClaims: get (tests put them in ``claims``); Nodes: get; ``/version``.
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

import kubernetes_validate

__all__ = ["TestApiServer", "slice_problems", "kubeconfig"]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)$")
NODE = re.compile(r"^/api/v1/nodes/([^/]+)$")


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
    for term in filter(None, (selector or "").split(",")):
        key, _, want = term.partition("=")
        value = obj
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if str(value if value is not None else "") != want:
            return False
    return True


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
            code, body = api.answer(method, url.path, query, self._body() if method in ("POST", "PUT") else None, self)
        except Exception as e:       # a bug in the test server: say so to the client
            code, body = 500, _status(500, "InternalError", f"test API server: {type(e).__name__}: {e}")
        if code:
            self._send(code, body)

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_PUT(self):
        self._route("PUT")

    def do_DELETE(self):
        self._route("DELETE")


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
        self._events: list[tuple[int, str, dict]] = []
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

    def _stamp(self, obj: dict, kind: str) -> dict:
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        meta.setdefault("uid", str(uuidlib.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        return obj

    def _event(self, kind: str, obj: dict) -> None:
        self._events.append((self._rv, kind, json.loads(json.dumps(obj))))
        self._cond.notify_all()

    def add_node(self, name: str) -> dict:
        with self._cond:
            node = self._stamp({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}, "Node")
            self.nodes[name] = node
            return node

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

    def _check(self, obj: dict) -> list[str]:
        try:
            kubernetes_validate.validate(obj, f"{self.version[0]}.{self.version[1]}", strict=True)
            problems = []
        except kubernetes_validate.ValidationError as e:
            problems = [f"schema: {e.message} at {'.'.join(str(p) for p in e.path)}"]
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
        m = NODE.match(path)
        if m and method == "GET":
            node = self.nodes.get(m.group(1))
            return (200, node) if node else (404, _status(404, "NotFound", f'nodes "{m.group(1)}" not found'))
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
        return 404, _status(404, "NotFound", f"the test API server has no {method} {path}")

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

    def _watch(self, query: dict, handler) -> None:
        selector = query.get("fieldSelector")
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
                if since:
                    position = int(since)
                    pending = [(k, o) for rv, k, o in self._events if rv > position and _selected(o, selector)]
                else:
                    position = self._rv
                    pending = [("ADDED", s) for s in self.slices.values() if _selected(s, selector)]
            for kind, obj in pending:
                send(kind, obj)
            while self.up and time.monotonic() < deadline:
                with self._cond:
                    self._cond.wait(0.2)
                    fresh = [(rv, k, o) for rv, k, o in self._events if rv > position]
                    if fresh:
                        position = fresh[-1][0]
                for _, kind, obj in fresh:
                    if _selected(obj, selector):
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
