"""The client's policy over an in-process transport: paths, bodies, error mapping, streams."""

import json

import pytest

from hostagent.client import Client, DaemonNotRunning, HandlerTransport, Response
from hostagent.errors import ConflictError, NotFoundError, PermissionDenied, UsageError


def answer(status, data, **headers):
    return Response(status, headers, json.dumps(data).encode())


def test_requests_and_answers():
    seen = []

    def handler(request):
        seen.append(request)
        if request.path == "/v1/allocations" and request.method == "POST":
            return answer(201, {"id": json.loads(request.body)["id"], "cdi_devices": ["k=v"]})
        return answer(200, {"path": request.path})
    with Client(transport=HandlerTransport(handler)) as c:
        assert c.device("nvidia.com/gpu=0")["path"] == "/v1/devices/nvidia.com%2Fgpu%3D0"
        assert c.devices(type="mig", profiles=True)["path"] == "/v1/devices?type=mig&profiles=true"
        assert c.allocate("ns/p", ["0", {"constraints": {"profile": "1g.5gb"}}])["id"] == "ns/p"
        assert json.loads(seen[-1].body) == {"id": "ns/p", "devices": [
            {"device": "0"}, {"constraints": {"profile": "1g.5gb"}}]}


@pytest.mark.parametrize("status, cls", [(400, UsageError), (403, PermissionDenied), (404, NotFoundError),
                                         (409, ConflictError), (422, UsageError)])
def test_errors_keep_the_servers_code(status, cls):
    c = Client(transport=HandlerTransport(lambda r: answer(status, {
        "code": "device_busy", "message": "busy (hint)", "details": {"device": "G"}})))
    with pytest.raises(cls) as e:
        c.node()
    assert e.value.code == "device_busy" and e.value.message == "busy (hint)"
    assert e.value.details == {"device": "G"} and e.value.status == status


def test_stream_lines_across_chunks():
    chunks = [b'{"type": "snap', b'shot", "revision": 1}\n{"type"', b': "x", "revision": 2}\n']
    c = Client(transport=HandlerTransport(lambda r: Response(200, {}, stream=iter(chunks))))
    assert [e["revision"] for e in c.watch()] == [1, 2]


def test_no_daemon(tmp_path):
    with pytest.raises(DaemonNotRunning):
        Client(socket_path=tmp_path / "nothing.sock").node()


def test_mig_methods_and_missing_ok_release():
    seen = []

    def handler(request):
        seen.append((request.method, request.path, json.loads(request.body) if request.body else None))
        if request.method == "DELETE" and request.path.startswith("/v1/allocations/"):
            return answer(404, {"code": "not_found", "message": "no allocation 'x': already released",
                                "details": {}})
        return answer(200, {"ok": True})
    with Client(transport=HandlerTransport(handler)) as c:
        c.mig()
        c.mig_plan("all-balanced")
        c.mig_apply("all-1g.5gb", dry_run=True, force=True)
        c.mig_apply(spec={"version": "v1"}, hooks={"version": "v1"}, mode_only=True, skip_reset=True)
        c.mig_create_instance("1g.5gb", gpu=3)
        c.mig_destroy_instance("MIG-a/b", force=True)
        c.mig_destroy_instance("MIG-c")
        assert c.release("x", missing_ok=True) is None
        with pytest.raises(NotFoundError):
            c.release("x")
    assert seen[:7] == [
        ("GET", "/v1/mig", None),
        ("POST", "/v1/mig/plan", {"config": "all-balanced"}),
        ("POST", "/v1/mig/apply", {"config": "all-1g.5gb", "dry_run": True, "force": True}),
        ("POST", "/v1/mig/apply", {"spec": {"version": "v1"}, "hooks": {"version": "v1"}, "mode_only": True,
                                   "skip_reset": True}),
        ("POST", "/v1/mig/instances", {"profile": "1g.5gb", "gpu": "3"}),
        ("DELETE", "/v1/mig/instances/MIG-a%2Fb?force=true", None),
        ("DELETE", "/v1/mig/instances/MIG-c", None)]


class SilentStreamServer:
    """A socket that answers with a stream head announcing ``heartbeat``, sends ``lines``
    after ``delay`` seconds, then stays silent until closed."""

    def __init__(self, path, heartbeat, lines=(), delay=0.0):
        import socket
        import threading
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen()
        self.conns = []
        self.heartbeat, self.lines, self.delay = heartbeat, lines, delay
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import time
        conn, _ = self.sock.accept()
        self.conns.append(conn)
        conn.recv(65536)
        head = ("HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n"
                + (f"Hostagent-Heartbeat: {self.heartbeat}\r\n" if self.heartbeat else "") + "\r\n")
        conn.sendall(head.encode())
        time.sleep(self.delay)
        for line in self.lines:
            conn.sendall(b"%x\r\n%s\r\n" % (len(line), line))

    def close(self):
        for conn in self.conns:
            conn.close()
        self.sock.close()


def test_a_stream_waits_for_heartbeats_not_the_request_timeout(tmp_path):
    """An idle watch is silent between heartbeats: its reads wait three of the intervals the
    agent announces, not the client's request timeout."""
    server = SilentStreamServer(tmp_path / "s", heartbeat=1, lines=[b'{"type":"heartbeat","revision":1}\n'],
                                delay=0.5)
    try:
        with Client(socket_path=tmp_path / "s", timeout=0.2) as c:
            assert next(c.watch()) == {"type": "heartbeat", "revision": 1}
    finally:
        server.close()


def test_a_silent_stream_is_a_clear_error(tmp_path):
    from hostagent.errors import UnavailableError
    server = SilentStreamServer(tmp_path / "s", heartbeat=None)
    try:
        with Client(socket_path=tmp_path / "s", stream_timeout=0.2) as c:
            with pytest.raises(UnavailableError) as e:
                next(c.watch())
            assert "sent nothing (not even a heartbeat) for 0.2 s" in e.value.message
    finally:
        server.close()
