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
