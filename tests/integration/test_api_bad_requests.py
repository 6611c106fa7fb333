"""Bad requests of every kind get a JSON error with a stable code, and slow or hostile
clients do not stall the others."""

import json
import re
import socket
import threading
import time

import pytest

from .agentd import make_root, running_agent

CONFIG = {"api": {"header_timeout": 1, "body_timeout": 1, "write_timeout": 1, "idle_timeout": 2,
                  "max_connections": 40, "max_body_bytes": 4096, "max_header_bytes": 2048},
          "daemon": {"resync_interval": 0}}


def _short(value):
    return value[:40].decode("latin-1") if isinstance(value, bytes) else None


@pytest.fixture(scope="module")
def agent():
    with running_agent(make_root(), CONFIG) as proc:
        yield proc


def connect(agent, timeout=5) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(str(agent.socket))
    return s


def exchange(agent, data: bytes, timeout=5) -> bytes:
    with connect(agent, timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out


def parse(out: bytes) -> tuple[int, dict, dict]:
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, (json.loads(body) if body.strip() else {})


def post(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v1/allocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra +
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("body, code, status", [
    (b"{", "invalid_json", 400),
    (b'{"id": "a", "devices": [{"device": "1"}], }', "invalid_json", 400),
    (b'{"id": NaN, "devices": []}', "invalid_json", 400),
    (b'\xff\xfe{}', "invalid_json", 400),
    (b"", "invalid_json", 400),
    (b"[]", "invalid_argument", 400),
    (b'{"devices": [{"device": "1"}]}', "invalid_argument", 400),
    (b'{"id": "-bad-", "devices": [{"device": "1"}]}', "invalid_argument", 400),
    (b'{"id": "a", "devices": []}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"device": "1"}], "colour": "red"}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"constraints": {"min_memory_mib": 1}, "count": 0}]}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"constraints": {"compute_capability": "eight"}}]}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"constraints": {}}]}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"device": "1", "constraints": {"type": "gpu"}}]}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"device": "1"}], "sharing": {"strategy": "Sometimes"}}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"device": 7}]}', "invalid_argument", 400),
    (b'{"id": "a", "devices": [{"device": "77"}]}', "unknown_device", 422),
    (b'{"id": "a", "devices": [{"device": "0:99"}]}', "unknown_device", 422),
], ids=_short)
def test_bad_bodies(agent, body, code, status):
    got, headers, data = parse(exchange(agent, post(body)))
    assert (got, data["code"]) == (status, code), data
    assert set(data) == {"code", "message", "details"} and data["message"]
    assert headers["Content-Type"] == "application/json"


def test_schema_errors_name_their_place(agent):
    _, _, data = parse(exchange(agent, post(b'{"id": "a", "devices": [{"constraints": {"count": 2}}]}')))
    assert data["details"]["problems"] and data["message"].startswith("body.devices[0]")


@pytest.mark.parametrize("request_bytes, status, code", [
    (b"GET /v1/nothing HTTP/1.1\r\nConnection: close\r\n\r\n", 404, "not_found"),
    (b"PUT /v1/devices HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 405, "method_not_allowed"),
    (b"DELETE /v1/node HTTP/1.1\r\nConnection: close\r\n\r\n", 405, "method_not_allowed"),
    (b"GET /v1/devices HTTP/2.0\r\n\r\n", 505, "http_version_not_supported"),
    (b"GET http://x/v1/devices HTTP/1.1\r\n\r\n", 400, "bad_request"),
    (b"GET  /v1/devices HTTP/1.1\r\n\r\n", 400, "bad_request"),
    (b"G(T /v1/devices HTTP/1.1\r\n\r\n", 400, "bad_request"),
    (b"GET /v1/devices HTTP/1.1\r\nBad Header: x\r\n\r\n", 400, "bad_request"),
    (b"GET /v1/devices HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400, "bad_request"),
    (b"GET /v1/devices/%ff HTTP/1.1\r\n\r\n", 400, "bad_request"),
    (b"POST /v1/allocations HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400, "bad_request"),
    (b"POST /v1/allocations HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
     411, "length_required"),
    (b"POST /v1/allocations HTTP/1.1\r\nContent-Length: 99999\r\n\r\n", 413, "payload_too_large"),
    (b"GET /v1/" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
    (b"GET /v1/devices HTTP/1.1\r\nX: " + b"a" * 3000 + b"\r\n\r\n", 431, "header_too_large"),
    (b"GET /v1/devices HTTP/1.1\r\n" + b"X: a\r\n" * 100 + b"\r\n", 431, "header_too_large"),
    (b"GET /v1/watch?since=-1 HTTP/1.1\r\nConnection: close\r\n\r\n", 400, "invalid_argument"),
    (b"GET /v1/devices?type=cpu HTTP/1.1\r\nConnection: close\r\n\r\n", 400, "invalid_argument"),
    (b"POST /v1/inventory/refresh HTTP/1.0\r\n\r\n", 200, None),
], ids=_short)
def test_bad_framing(agent, request_bytes, status, code):
    got, _, data = parse(exchange(agent, request_bytes))
    assert got == status, data
    if code:
        assert data["code"] == code


def test_oversized_body_refused_before_it_is_sent(agent):
    """413 comes at the headers; with Expect: 100-continue the body is never asked for."""
    with connect(agent) as s:
        s.sendall(b"POST /v1/allocations HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n")
        status, _, data = parse(s.recv(65536))
        assert status == 413 and data["details"]["limit"] == 4096
        assert s.recv(100) == b""    # closed


def test_expect_continue(agent):
    body = json.dumps({"id": "ec", "devices": [{"device": "1"}]}).encode()
    with connect(agent) as s:
        s.sendall(b"POST /v1/allocations HTTP/1.1\r\nExpect: 100-continue\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert parse(out)[0] == 201
    assert parse(exchange(agent, b"DELETE /v1/allocations/ec HTTP/1.1\r\nConnection: close\r\n\r\n"))[0] == 200


def test_pipelined_requests_answered_in_order(agent):
    out = exchange(agent, b"GET /v1/node HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n"
                          b"GET /v1/devices HTTP/1.1\r\nConnection: close\r\n\r\n")
    statuses = [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", out)]
    assert statuses == [200, 404, 200]


def _timed_get(agent) -> float:
    start = time.monotonic()
    status, _, _ = parse(exchange(agent, b"GET /v1/devices HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert status == 200
    return time.monotonic() - start


@pytest.mark.root("root's connections are not bound per user: as another user the twenty slow ones would take "
                  "the slots the test's own requests need")
def test_slowloris_does_not_stall_others(agent):
    """Twenty clients trickle their headers a byte at a time; each gets 408 when its header
    deadline (1 s from its first byte) passes, however it trickles; meanwhile other clients
    are answered at once."""
    slow = [connect(agent) for _ in range(20)]
    stop = threading.Event()

    def trickle():
        i = 0
        while not stop.is_set() and i < 200:
            for s in slow:
                try:
                    s.send(b"GET /v1/devices HTTP/1.1\r\nX-Slow: "[i:i + 1] or b"a")
                except OSError:
                    pass
            i += 1
            time.sleep(0.05)
    t = threading.Thread(target=trickle)
    t.start()
    try:
        latencies = [_timed_get(agent) for _ in range(20)]
        assert max(latencies) < 0.5, latencies
        time.sleep(1.3)
        for s in slow:
            s.settimeout(3)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            assert parse(data)[0] == 408
    finally:
        stop.set()
        t.join()
        for s in slow:
            s.close()


def test_slow_body_times_out(agent):
    with connect(agent) as s:
        s.sendall(b"POST /v1/allocations HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"id\"")
        start = time.monotonic()
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        assert parse(data)[2]["code"] == "timeout" and 0.5 < time.monotonic() - start < 3


def test_client_that_never_reads_is_dropped(agent):
    """Thousands of pipelined requests and no reading: the agent stops reading from that
    client when its answers pile up, drops it after write_timeout, and serves others."""
    with connect(agent) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(0.2)
        request = b"GET /v1/devices HTTP/1.1\r\n\r\n"
        sent = 0
        for _ in range(5000):
            try:
                s.sendall(request)
                sent += 1
            except (socket.timeout, BlockingIOError, OSError):
                break
        assert _timed_get(agent) < 0.5
        time.sleep(2)
        s.settimeout(2)
        received, ended = b"", False
        try:
            while chunk := s.recv(1 << 20):
                received += chunk
            ended = True
        except ConnectionResetError:
            ended = True
        except socket.timeout:
            pass
        assert ended, "the agent kept a client that stopped reading"
        # Fewer answers than requests: the agent stopped answering, then hung up.
        assert received.count(b"HTTP/1.1 200 OK") < sent
    assert _timed_get(agent) < 0.5


def test_connection_limit(agent):
    held = []
    try:
        for _ in range(40):
            held.append(connect(agent))
        time.sleep(0.2)
        status, _, data = parse(exchange(agent, b"GET /v1/node HTTP/1.1\r\n\r\n"))
        assert status == 503 and data["code"] == "too_many_connections"
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert _timed_get(agent) < 0.5


def test_idle_keepalive_connection_closed(agent):
    with connect(agent, timeout=8) as s:
        s.sendall(b"GET /v1/node HTTP/1.1\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert s.recv(100) == b""          # closed quietly after idle_timeout (2 s)
        assert 1.5 < time.monotonic() - start < 4
