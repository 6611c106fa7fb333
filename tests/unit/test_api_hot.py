"""Reads answered again without a parse: a request head seen before, from the same caller,
at the same snapshot, gets the very answer it got then (bytes included), and nothing else
ever does."""

import asyncio

from hostagent.api.http import parse_head
from hostagent.api.peercred import Caller
from hostagent.api.routes import App
from hostagent.api.server import ApiServer, Connection, ServerOptions
from hostagent.daemon.state import Snapshot
from hostagent.metrics.agent import AgentMetrics

ADMIN = Caller(pid=1, uid=0, gid=0, groups=(), role="admin")
OPERATOR = Caller(pid=2, uid=1000, gid=1000, groups=(), role="operator")
DEVICES = b"GET /v1/devices HTTP/1.1\r\nHost: t"


def snapshot(revision: int) -> Snapshot:
    gpu = {"kind": "gpu", "uuid": "GPU-1", "name": "0", "cdi_devices": ["nvidia.com/gpu=0"]}
    return Snapshot(revision, {}, {"GPU-1": gpu}, [], {}, {})


class Agent:
    def __init__(self):
        self.snapshot = snapshot(1)
        self.metrics = AgentMetrics()


def ask(app: App, head: bytes, caller=ADMIN, body: bytes = b""):
    request = parse_head(head)
    request.caller, request.head, request.body = caller, head, body
    return app(request)


def counted(agent: Agent, code: int = 200) -> int:
    return agent.metrics.api.counts[("GET", "/v1/devices", code)][0]


def test_a_repeated_read_gets_its_first_answer_until_the_snapshot_changes():
    agent = Agent()
    app = App(agent)
    assert app.hot(DEVICES, ADMIN) is None                       # never seen
    first = ask(app, DEVICES)
    assert first.status == 200 and b'"revision":1' in first.body
    assert app.hot(DEVICES, ADMIN) == (first, True, False)
    assert counted(agent) == 2                                   # the answer from the cache is counted too
    agent.snapshot = snapshot(2)
    assert app.hot(DEVICES, ADMIN) is None
    second = ask(app, DEVICES)
    assert b'"revision":2' in second.body and app.hot(DEVICES, ADMIN)[0] is second


def test_only_the_same_head_from_the_same_caller_is_answered():
    app = App(Agent())
    ask(app, DEVICES)
    assert app.hot(DEVICES, OPERATOR) is None
    assert app.hot(DEVICES + b"\r\nX-Other: 1", ADMIN) is None
    assert app.hot(DEVICES.replace(b"GET", b"HEAD"), ADMIN) is None
    # A conditional read is remembered with its own answer.
    conditional = DEVICES + b'\r\nIf-None-Match: "1"'
    assert ask(app, conditional).status == 304
    assert app.hot(conditional, ADMIN)[0].status == 304 and app.hot(DEVICES, ADMIN)[0].status == 200


def test_errors_mutations_and_requests_with_a_body_are_never_remembered():
    app = App(Agent())
    heads = [b"GET /v1/nothing HTTP/1.1", b"GET /v1/devices?type=cpu HTTP/1.1",
             b"GET /v1/devices/GPU-9 HTTP/1.1", b"GET /v1/devices HTTP/1.1\r\nContent-Length: 2"]
    for head in heads:
        ask(app, head, body=b"{}" if b"Content-Length" in head else b"")
        assert app.hot(head, ADMIN) is None
    assert app._hot == {}


def test_the_remembered_heads_are_bounded():
    app = App(Agent())
    for i in range(App.HOT_ENTRIES * 2):
        ask(app, DEVICES + b"\r\nX-N: %d" % i)
        assert len(app._hot) <= App.HOT_ENTRIES


class Transport:
    def __init__(self):
        self.out, self.eof = [], False

    def write(self, data):
        self.out.append(data)

    def write_eof(self):
        self.eof = True

    def get_extra_info(self, name):
        return None

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def close(self):
        pass


def test_the_server_writes_the_same_bytes_from_the_cache_and_keeps_the_connection_rules():
    async def run():
        app = App(Agent())
        server = ApiServer(app, ServerOptions())
        server.loop = asyncio.get_running_loop()
        conn = Connection(server)
        conn.transport, conn.caller = Transport(), ADMIN
        head = DEVICES + b"\r\n\r\n"
        conn.data_received(head + head)                          # parsed, then from the cache
        conn.data_received(DEVICES.replace(b"GET", b"HEAD") + b"\r\n\r\n")
        conn.data_received(DEVICES.replace(b"GET", b"HEAD") + b"\r\n\r\n")
        first, second, head_parsed, head_cached = conn.transport.out
        assert first == second and head_parsed == head_cached and first.startswith(head_cached)
        assert len(head_cached) < len(first) and not conn.transport.eof
        conn.data_received(DEVICES + b"\r\nConnection: close\r\n\r\n")
        conn.data_received(DEVICES + b"\r\nConnection: close\r\n\r\n")
        assert conn.transport.eof and b"Connection: close" in conn.transport.out[4]
        assert len(conn.transport.out) == 5                      # nothing answered after the close
        conn.connection_lost(None)
    asyncio.run(run())
