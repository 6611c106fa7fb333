"""The ``/v1`` routes: who may call what, and how each request becomes a response.

``App(agent)`` is the server's ``app(request)``: it answers reads synchronously from the
agent's current snapshot (rendered once per revision and cached), and returns coroutines
for mutations and the watch stream. Errors become ``{code, message, details}`` with an
HTTP status chosen by the error's class.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ..errors import (ConfigError, ConflictError, HostagentError, NotFoundError, NvmlError,
                      PermissionDenied, StateError, UnavailableError, UnknownName, UsageError)
from .http import Request
from .peercred import allows
from .schema import document_bytes, parse_json, validate_body
from .server import Response, StreamResponse, error_response
from .watch import WatchStream, watch_own, watch_types

__all__ = ["App", "status_for"]

_STATUS_BY_CODE = {"unknown_device": 422}
_STATUS_BY_CLASS = ((NotFoundError, 404), (PermissionDenied, 403), (ConflictError, 409),
                    (StateError, 409), (UsageError, 400), (ConfigError, 400),
                    (UnavailableError, 503), (NvmlError, 503))


def status_for(error: HostagentError) -> int:
    if error.code in _STATUS_BY_CODE:
        return _STATUS_BY_CODE[error.code]
    return next((s for cls, s in _STATUS_BY_CLASS if isinstance(error, cls)), 500)


def _error(e: HostagentError) -> Response:
    details = dict(e.details)
    if e.hint:
        details.setdefault("hint", e.hint)
    return error_response(status_for(e), e.code, e.message, details)


def _prefers_minimal(request: Request) -> bool:
    """``Prefer: return=minimal`` (RFC 7240): the answer without the bulk a caller does not use."""
    prefs = request.headers.get("prefer", "")
    return any(p.strip().lower() == "return=minimal" for part in prefs.split(",") for p in part.split(";"))


def _dumps(data) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Route:
    method: str
    handler: str          # App method name
    role: str             # least role: "operator" or "admin"


_FLAGS = {"true": True, "1": True, "false": False, "0": False}


class App:
    # Exact paths, then prefixes whose remainder is one parameter (it may contain '/', as
    # CDI names and pod/container allocation ids do).
    EXACT = {
        "/v1/openapi.json": (Route("GET", "get_openapi", "operator"),),
        "/v1/node": (Route("GET", "get_node", "operator"),),
        "/v1/live": (Route("GET", "get_live", "operator"),),
        "/v1/devices": (Route("GET", "list_devices", "operator"),),
        "/v1/topology": (Route("GET", "get_topology", "operator"),),
        "/v1/watch": (Route("GET", "watch", "operator"),),
        "/v1/allocations": (Route("GET", "list_allocations", "operator"),
                            Route("POST", "create_allocation", "operator")),
        "/v1/preferred-allocation": (Route("POST", "prefer_allocation", "operator"),),
        "/v1/checkpoint/unreadable": (Route("GET", "get_unreadable", "operator"),
                                      Route("DELETE", "dismiss_unreadable", "admin")),
        "/v1/inventory/refresh": (Route("POST", "refresh", "admin"),),
        "/v1/mig": (Route("GET", "get_mig", "operator"),),
        "/v1/mig/plan": (Route("POST", "plan_mig", "operator"),),
        "/v1/mig/apply": (Route("POST", "apply_mig", "admin"),),
        "/v1/mig/instances": (Route("POST", "create_mig_instance", "admin"),),
        "/v1/health": (Route("GET", "get_health", "operator"),),
        "/v1/health/clear": (Route("POST", "clear_health", "admin"),),
        "/v1/labels": (Route("GET", "get_labels", "operator"),),
        "/v1/driver": (Route("GET", "get_driver", "operator"),),
        "/v1/driver/verify": (Route("POST", "verify_driver", "admin"),),
        "/v1/driver/maintenance": (Route("POST", "enter_maintenance", "admin"),
                                   Route("DELETE", "leave_maintenance", "admin")),
        "/v1/driver/install": (Route("GET", "get_driver_install", "operator"),
                               Route("POST", "install_driver", "admin")),
        "/v1/sharing": (Route("GET", "get_sharing", "operator"), Route("PUT", "put_sharing", "admin")),
        "/metrics": (Route("GET", "get_metrics", "operator"),),
    }
    PREFIX = {
        "/v1/devices/": (Route("GET", "get_device", "operator"),),
        "/v1/allocations/": (Route("GET", "get_allocation", "operator"),
                             Route("DELETE", "delete_allocation", "operator")),
        "/v1/mig/instances/": (Route("DELETE", "destroy_mig_instance", "admin"),),
    }
    # Route labels of the request metrics: the OpenAPI path, never the raw one (unbounded).
    PATTERNS = {"/v1/devices/": "/v1/devices/{device}", "/v1/allocations/": "/v1/allocations/{id}",
                "/v1/mig/instances/": "/v1/mig/instances/{uuid}"}

    HOT_ENTRIES = 256

    def __init__(self, agent):
        self.agent = agent
        # Reads answered from the current snapshot, by their exact head and caller: a client
        # asking the same again (a plugin's poll, a monitor) is answered without a parse, a
        # route or a render. Emptied when the snapshot changes, so it keeps no old one alive.
        self._hot: dict = {}
        self._hot_snapshot = None

    @classmethod
    def add_routes(cls, exact: dict | None = None, prefix: dict | None = None) -> None:
        """For features that bring their own endpoints (MIG, metrics)."""
        for table, extra in ((cls.EXACT, exact or {}), (cls.PREFIX, prefix or {})):
            for path, routes in extra.items():
                table[path] = tuple(table.get(path, ())) + tuple(routes)

    def _route(self, request: Request):
        """(route, parameter, pattern); raises HttpNotFound or MethodNotAllowed (which carry
        the pattern for the request metrics)."""
        path = request.path
        routes = self.EXACT.get(path)
        param = None
        pattern = path
        if routes is None:
            for prefix, candidates in self.PREFIX.items():
                if path.startswith(prefix) and len(path) > len(prefix):
                    routes, param = candidates, path[len(prefix):]
                    pattern = self.PATTERNS.get(prefix, prefix + "{id}")
                    break
        if routes is None:
            raise HttpNotFound()
        method = "GET" if request.method == "HEAD" else request.method
        for route in routes:
            if route.method == method:
                return route, param, pattern
        raise MethodNotAllowed(sorted({r.method for r in routes} | ({"HEAD"} if any(
            r.method == "GET" for r in routes) else set())), pattern)

    def __call__(self, request: Request):
        started = time.perf_counter()
        pattern, result = self._answer(request)
        metrics = self.agent.metrics
        if isinstance(result, Response):
            metrics.api_request(request.method, pattern, result.status, time.perf_counter() - started)
            if request.snapshot is not None and request.head and not request.content_length:
                self._remember(request, pattern, result)
            return result
        return self._timed(result, request.method, pattern, started)

    def hot(self, head: bytes, caller):
        """(response, keep_alive, head_only) for a read seen before with this head, from
        this caller, at the current snapshot; None otherwise (then the request is parsed)."""
        started = time.perf_counter()
        if self._hot_snapshot is not self.agent.snapshot:
            return None
        entry = self._hot.get((head, caller.uid, caller.role))
        if entry is None:
            return None
        entry[1].record(time.perf_counter() - started)
        return entry[0]

    def _remember(self, request: Request, pattern: str, response: Response) -> None:
        if request.snapshot is not self.agent.snapshot:
            return
        if request.snapshot is not self._hot_snapshot or len(self._hot) >= self.HOT_ENTRIES:
            self._hot.clear()                        # a new snapshot, or many distinct heads
            self._hot_snapshot = request.snapshot
        caller = request.caller
        self._hot[(request.head, caller.uid, caller.role)] = (
            (response, request.keep_alive, request.method == "HEAD"),
            self.agent.metrics.api_slot(request.method, pattern, response.status))

    async def _timed(self, coroutine, method: str, pattern: str, started: float):
        """Mutations until their answer; streams until their first byte."""
        response = await coroutine
        self.agent.metrics.api_request(method, pattern, response.status, time.perf_counter() - started)
        return response

    def _answer(self, request: Request):
        caller = request.caller
        if caller is None or caller.role == "none":
            return "unmatched", error_response(403, "forbidden", "the caller may not use the agent's API",
                                               {"uid": getattr(caller, "uid", None),
                                                "hint": "be root or a member of the agent's group"})
        try:
            route, param, pattern = self._route(request)
        except HttpNotFound:
            return "unmatched", error_response(404, "not_found", f"no such endpoint: {request.path}")
        except MethodNotAllowed as e:
            r = error_response(405, "method_not_allowed", f"{request.method} is not allowed here",
                               {"allow": e.allowed})
            r.headers = (("Allow", ", ".join(e.allowed)),)
            return e.pattern, r
        if not allows(caller.role, route.role):
            return pattern, error_response(403, "forbidden", f"{route.method} {request.path} needs the "
                                           f"{route.role} role", {"role": caller.role, "needed": route.role})
        if param is not None:
            request.params["id"] = param
        try:
            result = getattr(self, route.handler)(request)
        except HostagentError as e:
            return pattern, _error(e)
        if isinstance(result, Response):
            return pattern, result
        return pattern, self._guard(result)

    async def _guard(self, coroutine):
        try:
            return await coroutine
        except HostagentError as e:
            return _error(e)

    # ---- helpers ------------------------------------------------------------------

    def _snapshot_response(self, request: Request, key, render) -> Response:
        """The snapshot's rendering of ``key``, one Response per snapshot (so its bytes on
        the wire are made once too), or 304 when the caller has this revision."""
        snap = request.snapshot = self.agent.snapshot
        etag = f'"{snap.revision}"'
        if request.headers.get("if-none-match") == etag:
            return Response(304, b"", (("ETag", etag),))
        return snap.cached(("response", key), lambda: Response(200, _dumps(render(snap)), (("ETag", etag),)))

    @staticmethod
    def _body(request: Request, operation_id: str):
        data = parse_json(request.body)
        validate_body(operation_id, data)
        return data

    # ---- handlers -----------------------------------------------------------------

    def get_openapi(self, request: Request) -> Response:
        return Response(200, document_bytes())

    def get_node(self, request: Request) -> Response:
        return self._snapshot_response(request, "node", lambda s: {"revision": s.revision, **s.node})

    def get_live(self, request: Request) -> Response:
        """Whether the agent's work moves (its worker, its mutex): the liveness probe's
        question, which an answering socket alone does not settle."""
        from .. import __version__
        import os
        why = self.agent.stuck()
        if why is not None:
            return error_response(503, "stuck", f"the agent's work is stuck: {why}",
                                  {"hint": "restart the agent (its liveness probe does)"})
        return Response(200, _dumps({"live": True, "version": __version__, "pid": os.getpid()}),
                        (("Cache-Control", "no-store"),))

    def list_devices(self, request: Request) -> Response:
        kind = request.param("type")
        if kind not in (None, "gpu", "mig"):
            raise UsageError("type must be gpu or mig", parameter="type")
        profiles = request.param("profiles")
        if profiles is not None and profiles not in _FLAGS:
            raise UsageError("profiles must be true or false", parameter="profiles")
        profiles = _FLAGS.get(profiles, False)

        def render(s):
            gpus = [] if kind == "mig" else [_with_profiles(d, s) if profiles else d for d in s.gpus]
            migs = [] if kind == "gpu" else s.mig_devices
            return {"revision": s.revision, "gpus": gpus, "mig_devices": migs, "unreadable": s.unreadable,
                    "unread": s.unread}
        return self._snapshot_response(request, ("devices", kind, profiles), render)

    def get_device(self, request: Request) -> Response:
        ident = request.params["id"]
        snap = self.agent.snapshot
        view = snap.find(ident)
        if view is None:
            raise UnknownName(f"no device {ident!r}", name=ident,
                              hint="use an index, UUID, MIG name (0:1) or CDI name from GET /v1/devices")
        return self._snapshot_response(request, ("device", view["uuid"]),
                                       lambda s: _with_profiles(view, s) if view["kind"] == "gpu" else view)

    def get_topology(self, request: Request) -> Response:
        from ..daemon.allocations import UnknownDevice
        from ..topology.matrix import document, select_gpus
        inventory = self.agent.inventory
        if inventory is None:
            raise UnavailableError("the node's inventory is not available", hint="see GET /v1/node")
        wanted = request.param("gpus")
        names = [n for n in wanted.split(",") if n.strip()] if wanted else None
        try:
            indices = select_gpus(inventory, names)
        except KeyError as e:
            raise UnknownDevice(f"no GPU {e.args[0]!r} on this node", device=e.args[0], parameter="gpus",
                                hint="name GPUs by index or UUID, as GET /v1/devices lists them") from None
        return self._snapshot_response(request, ("topology", tuple(indices)), lambda s: {
            "revision": s.revision, **document(inventory, indices)})

    def watch(self, request: Request):
        since = request.param("since")
        if since is not None:
            if not (since.isascii() and since.isdigit()) or len(since) > 19:
                raise UsageError("since must be a revision (a non-negative integer)", parameter="since")
            since = int(since)
        types = watch_types(request.param("types"))
        own = watch_own(request.param("own"))
        if request.method == "HEAD":
            return Response(200, b"", content_type="application/x-ndjson")
        producer = WatchStream(self.agent, since, types, own)
        # Clients size their read timeout from it (silence between heartbeats is normal).
        heartbeat = (("Hostagent-Heartbeat", f"{self.agent.settings.api.watch_heartbeat:g}"),)
        return _stream(producer, producer.farewell, heartbeat)

    def list_allocations(self, request: Request) -> Response:
        from ..model import allocation
        return self._snapshot_response(request, "allocations", lambda s: {
            "revision": s.revision,
            "allocations": [_with_missing(allocation(a), s) for a in s.allocations.values()]})

    def get_allocation(self, request: Request) -> Response:
        from ..model import allocation
        alloc_id = request.params["id"]
        alloc = self.agent.snapshot.allocations.get(alloc_id)
        if alloc is None:
            raise UnknownName(f"no allocation {alloc_id!r}", name=alloc_id)
        return self._snapshot_response(request, ("allocation", alloc_id),
                                       lambda s: _with_missing(allocation(alloc), s))

    def create_allocation(self, request: Request):
        body = self._body(request, "createAllocation")
        return self._create(body, request.caller.uid, minimal=_prefers_minimal(request))

    async def _create(self, body, uid: int, minimal: bool):
        from ..daemon.views import allocation_json
        created, alloc = await self.agent.allocator.allocate(body, uid)
        headers = (("Location", f"/v1/allocations/{alloc.id}"),)
        if minimal:
            headers += (("Preference-Applied", "return=minimal"),)
        return Response(201 if created else 200, allocation_json(alloc, edits=not minimal) + b"\n", headers)

    def delete_allocation(self, request: Request):
        return self._delete(request.params["id"], request.caller.uid)

    async def _delete(self, alloc_id, uid: int):
        from ..daemon.views import allocation_json
        alloc = await self.agent.allocator.release(alloc_id, uid)
        return Response(200, allocation_json(alloc) + b"\n")

    def get_unreadable(self, request: Request) -> Response:
        return Response(200, _dumps(self.agent.checkpoint_view()), (("Cache-Control", "no-store"),))

    def dismiss_unreadable(self, request: Request):
        return self._dismiss(request.caller.uid)

    async def _dismiss(self, uid: int):
        view = await self.agent.dismiss_unreadable(uid)
        return Response(200, _dumps(view))

    def prefer_allocation(self, request: Request) -> Response:
        from ..daemon.preference import prefer
        body = self._body(request, "preferAllocation")
        snap = self.agent.snapshot
        in_use = {uuid: len(users) for uuid, users in self.agent.users().items()}
        devices = prefer(body["available"], body.get("must_include", []), body["size"], snap.devices,
                         snap.lookup, in_use, body.get("policy", "distributed"), self.agent.links)
        return Response(200, _dumps({"devices": devices, "revision": snap.revision}))

    def refresh(self, request: Request):
        return self._refresh()

    async def _refresh(self):
        revision = await self.agent.refresh("api request")
        return Response(200, _dumps({"revision": revision}))


    # ---- MIG ----------------------------------------------------------------------

    def get_mig(self, request: Request) -> Response:
        agent = self.agent
        return self._snapshot_response(request, "mig", lambda s: {
            "revision": s.revision, **agent.mig.layouts(agent.inventory)})

    def plan_mig(self, request: Request):
        return self._json_result(self.agent.mig.plan(self._body(request, "planMig")))

    def apply_mig(self, request: Request):
        return self._json_result(self.agent.mig.apply(self._body(request, "applyMig")))

    def create_mig_instance(self, request: Request):
        return self._json_result(self.agent.mig.create(self._body(request, "createMigInstance")), 201)

    def destroy_mig_instance(self, request: Request):
        force = request.param("force")
        if force is not None and force not in _FLAGS:
            raise UsageError("force must be true or false", parameter="force")
        return self._json_result(self.agent.mig.destroy(request.params["id"], _FLAGS.get(force, False)))

    @staticmethod
    async def _json_result(coroutine, status: int = 200):
        return Response(status, _dumps(await coroutine))

    # ---- health, labels, metrics --------------------------------------------------

    def get_health(self, request: Request) -> Response:
        """The monitor's records in full (reasons, last XID, recovery time); not cached:
        a record's recovery time is not a published change."""
        link = self.agent.health_link
        state = link.state if link is not None else None
        options = link.options if link is not None else None
        return Response(200, _dumps({
            "revision": self.agent.snapshot.revision,
            "enabled": bool(options and options.enabled), "running": bool(link and link.running),
            "policy": options.policy.describe() if options else None,
            "quiet_period": options.quiet_period if options else None,
            "health_revision": state.revision if state else 0,
            "devices": [d.to_dict() for d in state.devices.values()] if state else []}))

    def clear_health(self, request: Request):
        body = self._body(request, "clearHealth")
        return self._clear(None if body.get("all") else body["devices"])

    async def _clear(self, devices):
        link = self.agent.health_link
        if link is None:
            raise UnavailableError("health monitoring is not running")
        cleared = await link.clear(devices)
        return Response(200, _dumps({"cleared": cleared, "revision": self.agent.events.revision}))

    def get_labels(self, request: Request) -> Response:
        def render(s):
            if s.labels is None:
                raise UnavailableError("no labels yet: the inventory has not been read",
                                       hint="see GET /v1/node")
            return {"revision": s.revision, **s.labels.view()}
        return self._snapshot_response(request, "labels", render)

    # ---- driver -------------------------------------------------------------------

    def get_driver(self, request: Request) -> Response:
        """Not cached: each verification updates checked_at without a published change."""
        return Response(200, _dumps({"revision": self.agent.snapshot.revision, **self.agent.driver.view()}))

    def verify_driver(self, request: Request):
        return self._verify_driver()

    async def _verify_driver(self):
        await self.agent.verify_driver("api request")
        return Response(200, _dumps({"revision": self.agent.events.revision, **self.agent.driver.view()}))

    def enter_maintenance(self, request: Request):
        return self._maintenance(self._body(request, "enterDriverMaintenance"))

    async def _maintenance(self, body):
        gate = self.agent.driver
        if gate.maintenance is not None and gate.maintenance["pid"] != body["pid"] and not gate._holder_gone():
            raise ConflictError(f"the driver is being changed already: {gate.maintenance['operation']} "
                                f"(pid {gate.maintenance['pid']})")
        await gate.enter_maintenance(body["pid"], body["operation"])
        return Response(200, _dumps({"revision": self.agent.events.revision, **gate.view(),
                                     "allocations": list(self.agent.allocations)}))

    def leave_maintenance(self, request: Request):
        return self._leave()

    async def _leave(self):
        await self.agent.driver.leave_maintenance("maintenance ended")
        return Response(200, _dumps({"revision": self.agent.events.revision, **self.agent.driver.view()}))

    def get_driver_install(self, request: Request):
        return self._json_result(self.agent.blocking(self.agent.driver_installs.view))

    def install_driver(self, request: Request):
        return self._install_driver(self._body(request, "installDriver"))

    async def _install_driver(self, body):
        installs, gate = self.agent.driver_installs, self.agent.driver
        verified = gate.verdict.driver_version if gate.state == "ready" and gate.verdict else None
        async with installs.lock:            # one start at a time: the second sees the first's report
            started, view = await self.agent.blocking(installs.start, body["version"], body.get("force", False),
                                                      verified)
        return Response(202 if started else 200, _dumps({"started": started, **view}))

    # ---- sharing ------------------------------------------------------------------

    def get_sharing(self, request: Request) -> Response:
        return Response(200, _dumps({"revision": self.agent.events.revision, **self.agent.sharing.view}))

    def put_sharing(self, request: Request):
        return self._json_result(self.agent.sharing.apply(self._body(request, "putSharing")))

    def get_metrics(self, request: Request) -> Response:
        link = self.agent.metrics_link
        if link is None:
            raise UnavailableError("metrics are not running")
        body, content_type = link.render()
        return Response(200, body, content_type=content_type)


async def _stream(producer, farewell=None, headers=()):
    return StreamResponse(producer, headers=headers, farewell=farewell)


def _with_profiles(view: dict, snap) -> dict:
    profiles = snap.profiles.get(view["uuid"])
    if profiles is None or view["mig"] is None:
        return view
    return {**view, "mig": {**view["mig"], "profiles": profiles}}


def _with_missing(view: dict, snap) -> dict:
    from ..daemon.views import with_device_marks
    return with_device_marks(view, snap.devices)


class HttpNotFound(Exception):
    pass


class MethodNotAllowed(Exception):
    def __init__(self, allowed, pattern: str = "unmatched"):
        super().__init__(allowed)
        self.allowed = allowed
        self.pattern = pattern
