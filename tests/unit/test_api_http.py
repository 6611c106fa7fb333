"""HTTP framing, pure: every malformed head is refused with the right status and code."""

import pytest

from hostagent.api.http import HttpError, Limits, chunk, parse_head, response_head


def test_parse_a_request():
    r = parse_head(b"POST /v1/allocations/ns%2Fpod?x=1&x=2&y= HTTP/1.1\r\nHost: a\r\n"
                   b"Content-Length: 12\r\nX-A: 1\r\nx-a: 2\r\nExpect: 100-continue")
    assert (r.method, r.path, r.raw_path) == ("POST", "/v1/allocations/ns/pod", "/v1/allocations/ns%2Fpod")
    assert r.param("x") == "2" and r.param("y") == "" and r.param("z") is None
    assert r.content_length == 12 and r.keep_alive and r.expect_continue
    assert r.headers["x-a"] == "1, 2"


@pytest.mark.parametrize("version, connection, keep", [
    ("HTTP/1.1", "", True), ("HTTP/1.1", "close", False), ("HTTP/1.0", "", False),
    ("HTTP/1.0", "keep-alive", True)])
def test_keep_alive(version, connection, keep):
    head = f"GET / {version}" + (f"\r\nConnection: {connection}" if connection else "")
    assert parse_head(head.encode()).keep_alive is keep


@pytest.mark.parametrize("head, status, code", [
    (b"GET /", 400, "bad_request"),
    (b"GET / HTTP/1.1 extra", 400, "bad_request"),
    (b"GET / HTTP/3", 505, "http_version_not_supported"),
    (b"GET / SPDY/1", 400, "bad_request"),
    (b"G\x00T / HTTP/1.1", 400, "bad_request"),
    (b"GET * HTTP/1.1", 400, "bad_request"),
    (b"GET /%zz%ff HTTP/1.1", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nNoColon", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\n folded: x", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nContent-Length: -1", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nContent-Length: 1, 2", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nContent-Length: 9999999", 413, "payload_too_large"),
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked", 411, "length_required"),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1", 414, "uri_too_long"),
    (b"GET / HTTP/1.1" + b"\r\nX: y" * 70, 431, "header_too_large"),
    (b"GET /?" + b"&".join(b"a%d=1" % i for i in range(40)) + b" HTTP/1.1", 400, "bad_request"),
])
def test_refusals(head, status, code):
    with pytest.raises(HttpError) as e:
        parse_head(head, Limits(max_body_bytes=1000))
    assert (e.value.status, e.value.code) == (status, code)


def test_response_head_and_chunks():
    assert response_head(200, [("A", "b")], length=3, keep_alive=True) == \
        b"HTTP/1.1 200 OK\r\nA: b\r\nContent-Length: 3\r\n\r\n"
    assert response_head(404, [], length=None, keep_alive=False) == \
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    assert chunk(b"hello\n") == b"6\r\nhello\n\r\n"
