"""Property tests against the running daemon, driven by its OpenAPI document.

Every operation of the document gets requests generated from the document itself (path and
query parameters from their schemas, bodies from the operation's request schema, mixed with
names of devices, allocations and configs that exist so that the successful answers are
reached too) and arbitrary methods, paths, JSON and bytes. Every answer must be one the
document lists for that operation (or, for a request no operation matches, one of its
shared responses), and its body must validate against the documented schema. The daemon
runs as root, so every operation is reachable; it changes the simulated node freely.
"""

import json
import re
import socket
import string
from urllib.parse import quote

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from hostagent.api.schema import document
from hostagent.client import Request
from hostagent.errors import HostagentError
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import make_root, running_agent

DOC = document()
METHODS = ("get", "post", "put", "delete")
OPERATIONS = {op["operationId"]: (path, method, op) for path, item in DOC["paths"].items()
              for method, op in item.items() if method in METHODS}
# Answers to requests that no operation matches (documented in components.responses).
FRAMING = ("400", "408", "411", "413", "414", "431", "505")
UNMATCHED = {"404": "NotFound", "405": "MethodNotAllowed", "400": "BadRequest",
             **{s: "FramingError" for s in FRAMING if s != "400"}}

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def agent():
    # MIG devices from the start, so that instances can be destroyed and allocations made.
    with running_agent(make_root(), {"api": {"header_timeout": 2, "body_timeout": 2, "watch_heartbeat": 2},
                                     "daemon": {"resync_interval": 0},
                                     "mig": {"config": "all-balanced"}}) as proc:
        yield proc
        assert proc.proc.poll() is None, proc.log()
        assert proc.stop() == 0, proc.log()


def _resolve(item: dict) -> dict:
    while "$ref" in item:
        node = DOC
        for part in item["$ref"].lstrip("#/").split("/"):
            node = node[part]
        item = node
    return item


def schema(name: str) -> dict:
    return {"components": DOC["components"], "$ref": f"#/components/schemas/{name}"}


def _validator(sch: dict):
    root = {"$schema": DOC["jsonSchemaDialect"], "components": DOC["components"], **sch}
    return jsonschema.Draft202012Validator(root)


def documented(operation_id: str | None) -> dict[str, dict]:
    """status -> the documented response (references resolved)."""
    if operation_id is None:
        return {s: _resolve({"$ref": f"#/components/responses/{n}"}) for s, n in UNMATCHED.items()}
    return {s: _resolve(r) for s, r in OPERATIONS[operation_id][2]["responses"].items()}


def check(response, operation_id: str | None, method: str = "GET", first_line: bytes | None = None) -> None:
    """The status is documented for the operation; the body is as documented."""
    assert response.status < 500, response.body
    responses = documented(operation_id)
    assert str(response.status) in responses, (
        f"{operation_id or 'unmatched'}: status {response.status} is not documented "
        f"({sorted(responses)}): {response.body[:300]!r}")
    content = responses[str(response.status)].get("content")
    if method == "HEAD" or response.status == 304:
        assert not content or response.status != 304
        return
    assert content, f"{operation_id}: {response.status} is documented without a body"
    content_type = response.headers.get("content-type", "")
    assert content_type in content, f"{operation_id}: {content_type!r} not in {sorted(content)}"
    body = first_line if first_line is not None else response.body
    data = body.decode() if content_type.startswith("text/plain") else json.loads(body)
    errors = sorted(_validator(content[content_type]["schema"]).iter_errors(data), key=str)
    assert not errors, f"{operation_id} {response.status}: {errors[0].message[:500]} at {list(errors[0].absolute_path)}"


def exchange(agent, operation_id, method, path, body=None, headers=None):
    """Send, read (a stream: its head and first line) and check."""
    with agent.client() as c:
        response = c.transport.handle_request(Request(method, path, body, headers or {}))
        first = None
        if response.stream is not None:
            lines = response.lines()
            first = next(lines)
            lines.close()
        check(response, operation_id, method, first)
        return response


# ---- values that exist on the node, read at each example ------------------------------

def live(agent) -> dict:
    with agent.client() as c:
        try:        # one allocation always exists (the fuzzing may release it)
            c.allocate("fz-keep", [{"constraints": {"type": "any"}}], sharing={"strategy": "TimeSlicing"})
        except HostagentError:
            pass    # nothing left to share: the MIG fuzzing took it
        devices = c.devices(profiles=True)
        node = c.node()
        allocations = [a["id"] for a in c.allocations()]
    gpus, migs = devices["gpus"], devices["mig_devices"]
    names = [d["name"] for d in gpus + migs] + [d["uuid"] for d in gpus + migs] + \
            [n for d in gpus + migs for n in d["cdi_devices"]]
    profiles = sorted({p["name"] for g in gpus for p in (g["mig"] or {}).get("profiles", [])}) or ["1g.5gb"]
    return {"names": names, "gpus": [str(g["index"]) for g in gpus], "migs": [d["uuid"] for d in migs],
            "allocations": allocations or ["none"], "profiles": profiles, "revision": node["revision"],
            "driver": node["driver_version"]}


def pick(known: list):
    """One of ``known``, which is read from the node at each example and so may change:
    drawn as an index, so the same draws replay whatever the list holds now."""
    return st.integers(min_value=0, max_value=255).map(lambda i: known[i % len(known)])


TEXT = st.text(string.printable, max_size=12)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
CONFIGS = ["all-disabled", "all-enabled", "all-balanced", "all-1g.5gb", "all-3g.20gb", "nope"]


def path_value(name: str, now: dict):
    known = {"device": now["names"], "id": now["allocations"], "uuid": now["migs"] or ["MIG-none"]}[name]
    extra = from_schema(schema("AllocationId")) if name == "id" else TEXT.filter(bool)
    return st.one_of(pick(known), extra)


def query_value(param: dict):
    as_text = from_schema(param["schema"]).map(lambda v: v if isinstance(v, str) else json.dumps(v))
    return st.one_of(st.none(), as_text, as_text, TEXT)


def plausible_body(operation_id: str, now: dict):
    """Bodies naming what exists, so that successes are reached."""
    names = pick(now["names"])
    if operation_id == "createAllocation":
        return st.fixed_dictionaries(
            {"id": st.sampled_from(["fz-a", "fz-b", "ns/pod/ctr"]),
             "devices": st.lists(st.one_of(names.map(lambda n: {"device": n}),
                                           pick(now["profiles"]).map(
                                               lambda p: {"constraints": {"profile": p}})),
                                 min_size=1, max_size=2)},
            optional={"sharing": st.sampled_from([{"strategy": "TimeSlicing"}, {"strategy": "MPS"},
                                                  {"strategy": "Exclusive"}])})
    if operation_id in ("planMig", "applyMig"):
        return st.fixed_dictionaries({"config": st.sampled_from(CONFIGS)},
                                     optional={"dry_run": st.booleans(), "force": st.booleans()})
    if operation_id == "createMigInstance":
        return st.fixed_dictionaries({"profile": pick(now["profiles"])},
                                     optional={"gpu": pick(now["gpus"])})
    if operation_id == "preferAllocation":
        offered = st.lists(st.one_of(names, names.map(lambda n: n + "::1")), min_size=1, max_size=6, unique=True)
        return offered.flatmap(lambda ids: st.fixed_dictionaries(
            {"available": st.just(ids), "size": st.integers(1, len(ids) + 1)},
            optional={"must_include": st.lists(st.sampled_from(ids), max_size=2, unique=True),
                      "policy": st.sampled_from(["distributed", "packed"])}))
    if operation_id == "putSharing":        # plans, and off (nothing to stop): no daemons to leave behind
        config = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]},
                                               "timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}}
        return st.one_of(st.just({"config": None}), st.fixed_dictionaries({"config": st.just(config),
                                                                            "dry_run": st.just(True)}))
    if operation_id == "installDriver":       # the node's own version (nothing to do), one not offered
        return st.fixed_dictionaries({"version": st.sampled_from([now["driver"], "999.1.1", "latest"])},
                                     optional={"force": st.booleans()})
    if operation_id == "clearHealth":
        return st.one_of(st.just({"all": True}),
                         st.fixed_dictionaries({"devices": st.lists(names, min_size=1, max_size=3)}))
    return st.nothing()


def request_for(data, operation_id: str, now: dict):
    path, method, op = OPERATIONS[operation_id]
    for param in op.get("parameters", []):
        if param["in"] == "path":
            value = data.draw(path_value(param["name"], now), label=param["name"])
            path = path.replace("{%s}" % param["name"], quote(value, safe=""))
    query = {}
    for param in op.get("parameters", []):
        if param["in"] == "query":
            value = data.draw(query_value(param), label=param["name"])
            if value is not None:
                query[param["name"]] = value
    if query:
        path += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    body = None
    if "requestBody" in op:
        sch = op["requestBody"]["content"]["application/json"]["schema"]
        plausible = plausible_body(operation_id, now)
        value = data.draw(st.one_of(plausible, plausible, from_schema(
            {"components": DOC["components"], **sch}), JSON), label="body")
        body = json.dumps(value).encode()
    headers = {}
    if method == "get" and data.draw(st.booleans(), label="conditional"):
        headers["If-None-Match"] = f'"{now["revision"]}"'
    verb = data.draw(st.sampled_from(["GET", "HEAD"]), label="verb") if method == "get" else method.upper()
    return verb, path, body, headers


def _examples(operation_id: str) -> int:
    # MIG layout changes reset simulated GPUs: fewer of those keep the run short.
    return 20 if operation_id in ("applyMig", "createMigInstance", "destroyMigInstance") else 25


# Instances destroyed before some are created: the start layout leaves no room.
ORDER = sorted(OPERATIONS, key=lambda o: (o == "createMigInstance", o))


@pytest.mark.parametrize("operation_id", ORDER)
def test_every_operation_answers_as_documented(agent, operation_id):
    @settings(SETTINGS, max_examples=_examples(operation_id))
    @given(data=st.data())
    def run(data):
        now = live(agent)
        method, path, body, headers = request_for(data, operation_id, now)
        exchange(agent, operation_id, method, path, body, headers)
        if operation_id == "installDriver":         # an installer it started ends before the next example
            with agent.client() as c:
                until(lambda: c.driver_install()["state"] not in ("starting", "running"), 60, "the install's end")

    run()


def test_the_document_lists_every_operation_the_fuzzing_covers():
    assert {"createAllocation", "applyMig", "planMig", "createMigInstance", "destroyMigInstance",
            "getHealth", "clearHealth", "getLabels", "getMetrics", "watch", "getSharing", "putSharing"} <= set(OPERATIONS)


@settings(SETTINGS, max_examples=60)
@given(body=from_schema(schema("AllocationRequest")))
def test_schema_valid_allocations(agent, body):
    response = exchange(agent, "createAllocation", "POST", "/v1/allocations", json.dumps(body).encode())
    if response.status in (200, 201):
        exchange(agent, "deleteAllocation", "DELETE", "/v1/allocations/" + quote(body["id"], safe=""))


ALMOST = st.fixed_dictionaries({"id": st.text(max_size=20), "devices": st.lists(
    st.one_of(st.fixed_dictionaries({"device": JSON}),
              st.fixed_dictionaries({"constraints": st.dictionaries(
                  st.sampled_from(["type", "profile", "min_memory_mib", "compute_capability", "product", "x"]),
                  JSON, max_size=3), "count": JSON})), max_size=3)},
    optional={"sharing": st.dictionaries(st.sampled_from(["strategy", "mpsConfig", "timeSlicingConfig"]),
                                         JSON, max_size=2), "labels": JSON})


@SETTINGS
@given(body=st.one_of(JSON, ALMOST))
def test_arbitrary_json_bodies(agent, body):
    response = exchange(agent, "createAllocation", "POST", "/v1/allocations", json.dumps(body).encode())
    if response.status in (200, 201):
        exchange(agent, "deleteAllocation", "DELETE",
                 "/v1/allocations/" + quote(json.loads(response.body)["id"], safe=""))


def operation_of(method: str, path: str) -> str | None:
    """The operation a request reaches, as the server routes it (None: no operation)."""
    from hostagent.api.http import parse_head
    try:
        raw = parse_head(f"{method} {path} HTTP/1.1".encode()).path
    except Exception:
        return None
    verb = "get" if method == "HEAD" else method.lower()
    exact = [(o, t) for o, (t, m, _) in OPERATIONS.items() if m == verb and "{" not in t]
    templated = [(o, t) for o, (t, m, _) in OPERATIONS.items() if m == verb and "{" in t]
    for operation_id, template in exact + templated:       # the server's order
        pattern = "^" + ".+".join(map(re.escape, re.split(r"\{[^}]+\}", template))) + "$"
        if re.match(pattern, raw, re.S):
            return operation_id
    return None


PATHS = st.sampled_from(["/v1/node", "/v1/devices", "/v1/devices/", "/v1/devices/0", "/v1/watch?since=x",
                         "/v1/allocations", "/v1/allocations/", "/v1/openapi.json", "/v1/inventory/refresh",
                         "/v1/mig", "/v1/mig/plan", "/v1/mig/apply", "/v1/mig/instances",
                         "/v1/mig/instances/MIG-x", "/v1/health", "/v1/health/clear", "/v1/labels",
                         "/metrics", "/", "/v2/node", "/v1/devices/%00", "/v1/devices/nvidia.com%2Fgpu=0"])


@SETTINGS
@given(method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "X"]),
       path=st.one_of(PATHS, st.builds(lambda p, q: p + "?" + q, PATHS, st.text(string.printable, max_size=30)),
                      st.text(string.ascii_letters + "/%?=&.:", max_size=40).map(lambda t: "/v1/" + t)),
       body=st.one_of(st.none(), st.binary(max_size=64)))
def test_methods_paths_and_queries(agent, method, path, body):
    path = path.replace(" ", "%20").replace("#", "%23")
    operation_id = operation_of(method, path)
    if operation_id in ("applyMig", "createMigInstance", "destroyMigInstance") and body:
        return      # bytes are no JSON; but an empty-ish body could change the layout: elsewhere
    exchange(agent, operation_id, method, path, body)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.builds(
    lambda a, b: a + b"\r\n" + b + b"\r\n\r\n",
    st.sampled_from([b"GET /v1/node HTTP/1.1", b"POST /v1/allocations HTTP/1.1", b"GET / HTTP/1.0",
                     b"GET /v1/devices HTTP/1.1", b"GET /metrics HTTP/1.1", b"POST /v1/mig/plan HTTP/1.1",
                     b"GET /v1/labels HTTP/2.0"]),
    st.binary(max_size=120)))
def test_raw_bytes(agent, data):
    """Whatever arrives on the socket: no 5xx but 505, each status one every operation
    lists for framing errors, and the agent stays up."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(3)
        s.connect(str(agent.socket))
        s.sendall(data + b"\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    listed = set.intersection(*(set(op["responses"]) for _, _, op in OPERATIONS.values())) | set(UNMATCHED)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", out)
    assert statuses, f"no answer to {data[:100]!r}"
    for status in statuses:
        status = status.decode()
        assert status == "505" or int(status) < 500, out[:500]
        assert status in listed or status in ("200", "201", "304"), out[:500]


def test_framing_statuses_are_listed_by_every_operation():
    for operation_id, (_, _, op) in OPERATIONS.items():
        missing = set(FRAMING) - set(op["responses"])
        assert not missing, f"{operation_id} does not list {sorted(missing)}"


@GPU_CHANGES
def test_successes_of_the_mutations_match_their_schemas(agent):
    """The generated requests reach most successes by chance; these reach each for sure."""
    def post(operation_id, path, body, status):
        response = exchange(agent, operation_id, "POST", path, None if body is None else json.dumps(body).encode())
        assert response.status == status, response.body
        return json.loads(response.body)

    with agent.client() as c:
        for a in c.allocations():
            c.release(a["id"])
        start = c.node()["revision"]
    post("planMig", "/v1/mig/plan", {"config": "all-balanced"}, 200)
    post("applyMig", "/v1/mig/apply", {"config": "all-balanced", "dry_run": True}, 200)
    post("applyMig", "/v1/mig/apply", {"config": "all-balanced"}, 200)
    mig = json.loads(exchange(agent, "listDevices", "GET", "/v1/devices?type=mig").body)["mig_devices"][0]
    exchange(agent, "destroyMigInstance", "DELETE", "/v1/mig/instances/" + mig["uuid"])
    created = post("createMigInstance", "/v1/mig/instances", {"profile": mig["profile"]}, 201)
    post("createAllocation", "/v1/allocations", {"id": "fz-ok", "devices": [{"device": created["uuid"]}]}, 201)
    exchange(agent, "getAllocation", "GET", "/v1/allocations/fz-ok")
    exchange(agent, "deleteAllocation", "DELETE", "/v1/allocations/fz-ok")
    post("clearHealth", "/v1/health/clear", {"all": True}, 200)
    end = post("refreshInventory", "/v1/inventory/refresh", None, 200)["revision"]

    # Every event those made, as the watch schema documents it.
    event = _validator(documented("watch")["200"]["content"]["application/x-ndjson"]["schema"])
    types = set()
    with agent.client() as c:
        for e in c.watch(since=start):
            errors = list(event.iter_errors(e))
            assert not errors, f"{e['type']}: {errors[0].message[:300]} at {list(errors[0].absolute_path)}"
            types.add(e["type"])
            if e["revision"] >= end:
                break
    assert {"allocation_created", "allocation_deleted", "device_added", "device_removed",
            "node_changed"} <= types, types
