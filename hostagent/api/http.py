"""HTTP/1.1 framing as pure functions: parse a request head, render a response head.

The server feeds bytes in and writes bytes out; nothing here does I/O, so every malformed
request can be tested without a socket. Only what a local JSON API needs: origin-form
targets, Content-Length bodies (no chunked request bodies), keep-alive, Expect: 100-continue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

__all__ = ["HttpError", "Request", "Limits", "parse_head", "response_head", "chunk", "REASONS",
           "LAST_CHUNK"]

REASONS = {100: "Continue", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
           304: "Not Modified", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
           411: "Length Required", 413: "Content Too Large", 414: "URI Too Long",
           415: "Unsupported Media Type", 422: "Unprocessable Content",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")      # whole values only (fullmatch)
_VERSION = re.compile(rb"HTTP/1\.[01]")
LAST_CHUNK = b"0\r\n\r\n"


class HttpError(Exception):
    """A request the server answers with an error status; ``code`` is the API's stable code."""

    def __init__(self, status: int, code: str, message: str, **details):
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 16384
    max_headers: int = 64
    max_body_bytes: int = 262144
    max_target_bytes: int = 4096


@dataclass
class Request:
    method: str
    target: str                        # as sent: path and query
    path: str                          # percent-decoded path
    raw_path: str                      # path before decoding (segments may hold %2F)
    query: dict[str, list[str]]
    version: str                       # "HTTP/1.1"
    headers: dict[str, str]            # lower-case names; repeated headers joined with ", "
    content_length: int = 0
    keep_alive: bool = True
    expect_continue: bool = False
    body: bytes = b""
    caller: object = None              # set by the server: the peer's credentials
    params: dict[str, str] = field(default_factory=dict)   # set by the router
    head: bytes = b""                  # set by the server: the head as received
    snapshot: object = None            # set by the routes: the snapshot a read was answered from

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


def parse_head(head: bytes, limits: Limits = Limits()) -> Request:
    """Parse a request line and headers (``head`` ends before the blank line)."""
    lines = head.split(b"\r\n")
    try:
        method, target, version = lines[0].split(b" ")
    except ValueError:
        raise HttpError(400, "bad_request", "malformed request line") from None
    if not _TOKEN.fullmatch(method):
        raise HttpError(400, "bad_request", "malformed method")
    if not _VERSION.fullmatch(version):
        if version.startswith(b"HTTP/"):
            raise HttpError(505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served")
        raise HttpError(400, "bad_request", "malformed request line")
    if len(target) > limits.max_target_bytes:
        raise HttpError(414, "uri_too_long", f"request target longer than {limits.max_target_bytes} bytes")
    if not target.startswith(b"/"):
        raise HttpError(400, "bad_request", "the request target must be an absolute path")
    if len(lines) - 1 > limits.max_headers:
        raise HttpError(431, "header_too_large", f"more than {limits.max_headers} header fields")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            # Also refuses obsolete line folding (a line starting with a space).
            raise HttpError(400, "bad_request", "malformed header field")
        try:
            text = value.strip(b" \t").decode("latin-1")
        except UnicodeDecodeError:   # pragma: no cover - latin-1 decodes every byte
            raise HttpError(400, "bad_request", "malformed header value") from None
        if any(c in text for c in "\r\n\0"):
            raise HttpError(400, "bad_request", "malformed header value")
        key = name.decode("ascii").lower()
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    version_text = version.decode("ascii")
    request = _request(method.decode("ascii"), target.decode("latin-1"), version_text, headers)
    if "transfer-encoding" in headers:
        raise HttpError(411, "length_required",
                        "chunked request bodies are not accepted; send Content-Length")
    length = headers.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()) or len(length) > 18:
            raise HttpError(400, "bad_request", "malformed Content-Length")
        request.content_length = int(length)
        if request.content_length > limits.max_body_bytes:
            raise HttpError(413, "payload_too_large",
                            f"request body larger than {limits.max_body_bytes} bytes",
                            limit=limits.max_body_bytes)
    connection = headers.get("connection", "").lower()
    if version_text == "HTTP/1.0":
        request.keep_alive = "keep-alive" in connection
    else:
        request.keep_alive = "close" not in connection
    request.expect_continue = headers.get("expect", "").lower() == "100-continue"
    return request


def _request(method: str, target: str, version: str, headers: dict) -> Request:
    raw_path, _, query_text = target.partition("?")
    raw_path = raw_path.partition("#")[0]
    try:
        query = parse_qs(query_text, keep_blank_values=True, strict_parsing=False,
                         errors="strict", max_num_fields=32) if query_text else {}
        path = unquote(raw_path, errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise HttpError(400, "bad_request", "malformed request target") from None
    return Request(method=method, target=target, path=path, raw_path=raw_path, query=query,
                   version=version, headers=headers)


def response_head(status: int, headers: list[tuple[str, str]], *, length: int | None,
                  keep_alive: bool) -> bytes:
    """Status line and headers. ``length`` None: a chunked (streamed) body."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length is None:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {length}")
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)
