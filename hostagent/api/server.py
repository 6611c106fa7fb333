"""The API's HTTP/1.1 server on a UNIX socket: one asyncio protocol per connection.

A protocol rather than streams: a cached GET is parsed and answered inside
``data_received`` with no task, no future and no copy beyond the response bytes, which is
what makes thousands of requests a second cheap on a small host.

Defences, so one slow or hostile client cannot stall the others:

- who may connect is decided at accept, from the peer's credentials: a caller without a
  role gets its 403 and is closed at once, holding no connection slot;
- a bound on open connections, overall and per non-root user, with the last slots kept
  for root; when a bound is reached, an idle (or half-sent, or streaming) connection of
  whoever holds the most is closed to make room, so hoarded connections cost their
  holder, never root or another operator (503 only when every slot is answering a request);
- a header deadline that runs from a request's first byte (bytes trickled in do not extend
  it), a body deadline, an idle deadline between keep-alive requests;
- size limits on the request line, headers and body (414, 431, 413);
- flow control: when a client stops reading, the server stops reading its requests, and a
  client that has not read for ``write_timeout`` is dropped;
- requests on one connection are answered in order, one at a time (no pipelining fan-out).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

from .http import LAST_CHUNK, HttpError, Limits, Request, chunk, parse_head, response_head
from .peercred import Caller, peer_caller

__all__ = ["Response", "StreamResponse", "ServerOptions", "ApiServer", "error_response", "json_response"]

log = logging.getLogger("hostagent.api")

_IDLE, _HEAD, _BODY, _BUSY = range(4)


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "application/json"
    # The bytes on the wire, per (keep_alive, head_only): a response the routes cache (a
    # snapshot's) is rendered once, not at every request.
    wire: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass
class StreamResponse:
    """A chunked body written by ``producer(stream)`` until it returns or the client leaves."""
    producer: object                   # async callable taking a Stream
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "application/x-ndjson"
    farewell: object = None            # () -> bytes: the last data when the server stops


def json_response(status: int, data, headers=()) -> Response:
    return Response(status, json.dumps(data, separators=(",", ":")).encode() + b"\n", tuple(headers))


def error_response(status: int, code: str, message: str, details: dict | None = None) -> Response:
    return json_response(status, {"code": code, "message": message, "details": details or {}})


@dataclass
class ServerOptions:
    limits: Limits = field(default_factory=Limits)
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    idle_timeout: float = 60.0
    write_timeout: float = 30.0
    max_connections: int = 512
    max_connections_per_user: int = 64
    root_reserved: int = 32            # of max_connections, only root may take these
    agent_gid: int | None = None


class Stream:
    """The write side of a streamed response, with the connection's flow control."""

    def __init__(self, conn: "Connection"):
        self._conn = conn

    @property
    def closed(self) -> bool:
        return self._conn.closed

    async def send(self, data: bytes) -> None:
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client went away")
        conn.transport.write(chunk(data))
        if conn.write_paused:
            await conn.drain()


class Connection(asyncio.Protocol):
    def __init__(self, server: "ApiServer"):
        self.server = server
        self.loop = server.loop
        self.transport = None
        self.caller: Caller | None = None
        self.buf = bytearray()
        self.phase = _IDLE
        self.request: Request | None = None
        self.timer = None                  # the deadline's timer (see _arm)
        self.timer_at = 0.0
        self.head_armed = False            # the current head's deadline is set
        self.deadline: float | None = None
        self.on_deadline = None
        self.linger_timer = None
        self.task = None
        self.closed = False
        self.write_paused = False
        self.streaming = False
        self.lingering = False
        self.evicted = False
        self.last_active = 0.0
        self._drain_waiter = None

    # ---- lifecycle --------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        server = self.server
        try:
            self.caller = peer_caller(transport.get_extra_info("socket"), server.options.agent_gid)
        except OSError:
            self.caller = Caller(pid=0, uid=-1, gid=-1, groups=())
        self.last_active = self.loop.time()
        if self.caller.role == "none":
            # Refused by who it is, before it costs a slot or a parse.
            self._refuse(error_response(403, "forbidden", "the caller may not use the agent's API",
                                        {"uid": self.caller.uid,
                                         "hint": "be root or a member of the agent's group"}))
            return
        if not server.admit(self):
            self._refuse(error_response(
                503, "too_many_connections", "the agent's connections are all answering requests; retry later"))
            return
        self._arm(server.options.header_timeout, self._timed_out)

    def _refuse(self, response: Response):
        self.transport.write(self._render(response, keep_alive=False))
        self.linger()

    def evict(self) -> None:
        """Give this connection's slot to a newcomer: it is released now; an idle one is
        closed, a half-sent request gets a 503, a stream ends with its last chunk."""
        self.evicted = True
        self.server.release(self)
        if self.streaming and self.task is not None and not self.task.done():
            self.task.cancel()
        elif self.phase in (_HEAD, _BODY) or self.buf:
            self._send(error_response(503, "connection_reclaimed", "this connection was closed to serve "
                                      "another caller; retry with fewer connections"), keep_alive=False)
            self.linger()
        else:
            self.close()

    def evictable(self) -> int | None:
        """How cheaply this connection gives up its slot (lower first); None: it is
        answering a request, which always runs to its end."""
        if self.closed:
            return None
        if self.streaming:
            return 2
        if self.phase == _BUSY:
            return None
        return 0 if self.phase == _IDLE and not self.buf else 1

    def connection_lost(self, exc):
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        if self.closed and self not in self.server.connections:
            return
        self.closed = True
        self._stop_timer()
        self.server.release(self)
        # Only streams end with their client. A mutation runs to its end (and its answer is
        # dropped): cancelling it half-way would leave the agent's memory and its checkpoint
        # disagreeing.
        if self.streaming and self.task is not None and not self.task.done():
            self.task.cancel()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ConnectionResetError("the client went away"))

    def close(self):
        if not self.closed:
            self.closed = True
            self._stop_timer()
            self.transport.close()

    def linger(self):
        """Close after a final answer: half-close, then discard what the client still sends
        until it closes (or a second passes). Closing with unread input would make the
        kernel reset the connection, and the client could lose the answer."""
        if self.closed:
            return
        self.closed = self.lingering = True
        self._stop_timer()
        try:
            self.transport.write_eof()
        except (OSError, RuntimeError):
            self.transport.close()
            return
        self.transport.resume_reading()
        self.linger_timer = self.loop.call_later(1.0, self.transport.close)

    def pause_writing(self):
        self.write_paused = True
        self._update_reading()
        self._arm(self.server.options.write_timeout, self._write_timed_out)

    def resume_writing(self):
        self.write_paused = False
        self._disarm()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if self.phase != _BUSY and not self.closed:
            self._update_reading()
            self._arm_idle()
            self._process()

    def _update_reading(self):
        """Read requests only while none is being answered and the client reads answers."""
        if self.closed:
            return
        if self.phase == _BUSY or self.write_paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    async def drain(self):
        if self.write_paused and not self.closed:
            self._drain_waiter = self.loop.create_future()
            await self._drain_waiter

    # ---- timers -----------------------------------------------------------------

    # One deadline at a time, watched by a timer that is moved only when a deadline comes
    # earlier than it: a keep-alive request sets two deadlines (its head's, then the idle
    # one), and making and cancelling a timer for each cost as much as parsing the request.
    # A timer that fires before its connection's deadline sets itself again for it.

    def _arm(self, seconds: float, callback, now: float | None = None):
        self.deadline = (self.loop.time() if now is None else now) + seconds
        self.on_deadline = callback
        if self.timer is None or self.deadline < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = self.deadline
            self.timer = self.loop.call_at(self.deadline, self._deadline_reached)

    def _disarm(self):
        """No deadline until the next _arm (the timer, if any, finds nothing to do)."""
        self.deadline = None

    def _stop_timer(self):
        self.deadline = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _deadline_reached(self):
        self.timer = None
        if self.deadline is None or self.closed:
            return
        if self.loop.time() < self.deadline:
            self.timer_at = self.deadline
            self.timer = self.loop.call_at(self.deadline, self._deadline_reached)
            return
        self.deadline = None
        self.on_deadline()

    def _arm_idle(self, now: float | None = None):
        """Between requests: the idle deadline, or the next head's when part of it is here."""
        self.head_armed = bool(self.buf)
        self._arm(self.server.options.header_timeout if self.buf else self.server.options.idle_timeout,
                  self._timed_out, now)

    def _timed_out(self):
        if self.closed:
            return
        if self.phase in (_HEAD, _BODY) or self.buf:
            what = "headers" if self.phase != _BODY else "body"
            self._send(error_response(408, "timeout", f"the request {what} did not arrive in time"),
                       keep_alive=False)
            self.linger()
            return
        self.close()

    def _write_timed_out(self):
        log.info("dropping %s: it stopped reading", self.caller.describe())
        self.closed = True
        self.transport.abort()

    # ---- reading ----------------------------------------------------------------

    def data_received(self, data):
        if self.closed:
            return          # lingering: discard
        if self.phase == _IDLE and not self.buf and not self.write_paused and self.server.hot is not None \
                and data.endswith(b"\r\n\r\n") and data.find(b"\r\n\r\n") == len(data) - 4:
            # One whole head and nothing more, as a client polling a read sends it (only a
            # head that was parsed and answered before is known to hot()).
            answer = self.server.hot(data[:-4], self.caller)
            if answer is not None:
                self._finish(*answer)
                return
        self.buf += data
        if self.phase == _IDLE:
            # The head's deadline runs from its first byte: set below when this chunk does
            # not complete it (a head that arrives whole is answered before any could pass).
            self.phase = _HEAD
            self.head_armed = False
        if self.phase != _BUSY:
            self._process()

    def _process(self):
        limits = self.server.options.limits
        while not self.closed and self.phase != _BUSY and not self.write_paused:
            if self.phase in (_IDLE, _HEAD):
                end = self.buf.find(b"\r\n\r\n", 0, limits.max_header_bytes + 4)
                if end < 0:
                    if len(self.buf) > limits.max_header_bytes:
                        if b"\r\n" not in self.buf[:limits.max_header_bytes]:
                            return self._fail(HttpError(414, "uri_too_long", "request line too long"))
                        return self._fail(HttpError(431, "header_too_large",
                                                    f"request head larger than {limits.max_header_bytes} bytes"))
                    if not self.buf:
                        self.phase = _IDLE
                    elif not self.head_armed:
                        self.head_armed = True
                        self._arm(self.server.options.header_timeout, self._timed_out)
                    return
                head = bytes(self.buf[:end])
                del self.buf[:end + 4]
                hot = self.server.hot
                if hot is not None:
                    answer = hot(head, self.caller)
                    if answer is not None:             # a cached read seen before: no parse
                        self._finish(*answer)
                        if not self.buf:
                            return
                        continue
                try:
                    request = parse_head(head, limits)
                except HttpError as e:
                    return self._fail(e)
                request.caller = self.caller
                request.head = head
                self.request = request
                if request.content_length:
                    self.phase = _BODY
                    self._arm(self.server.options.body_timeout, self._timed_out)
                    if request.expect_continue and len(self.buf) < request.content_length:
                        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            if self.phase == _BODY:
                request = self.request
                if len(self.buf) < request.content_length:
                    return
                request.body = bytes(self.buf[:request.content_length])
                del self.buf[:request.content_length]
            self._dispatch(self.request)

    def _fail(self, error: HttpError):
        """A request we cannot frame: answer and close (what follows cannot be trusted)."""
        self._send(error_response(error.status, error.code, error.message, error.details),
                   keep_alive=False)
        self.linger()

    # ---- answering --------------------------------------------------------------

    def _dispatch(self, request: Request):
        self.phase = _BUSY
        self.last_active = self.loop.time()
        self._disarm()
        try:
            result = self.server.app(request)
        except Exception:   # the app maps its own errors; this is a bug
            log.exception("handler failed for %s %s", request.method, request.target)
            result = error_response(500, "internal", "internal error")
        if isinstance(result, Response):
            self._finish(result, request.keep_alive, request.method == "HEAD")
            return
        self._update_reading()
        self.task = self.loop.create_task(self._run(request, result))

    async def _run(self, request: Request, awaitable):
        try:
            result = await awaitable
            if isinstance(result, StreamResponse):
                await self._stream(request, result)
                return
        except asyncio.CancelledError:
            self.close()
            raise
        except Exception:
            log.exception("handler failed for %s %s", request.method, request.target)
            result = error_response(500, "internal", "internal error")
        self.task = None
        if not self.closed:
            self._finish(result, request.keep_alive, request.method == "HEAD")
            self._update_reading()
            if self.phase != _BUSY:
                self._process()

    async def _stream(self, request: Request, result: StreamResponse):
        self.streaming = True
        headers = (("Content-Type", result.content_type), ("Cache-Control", "no-store")) + result.headers
        self.transport.write(response_head(result.status, list(headers), length=None, keep_alive=False))
        try:
            await result.producer(Stream(self))
            if not self.closed:
                self.transport.write(LAST_CHUNK)
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            # The server stops (or gives the slot away): end the body properly (a last line
            # saying so, then the zero-length chunk), so the client sees a complete
            # response, not a cut, and resumes. Chunks are written whole, so this never
            # lands inside one.
            if (self.server.closing or self.evicted) and not self.closed:
                if result.farewell is not None:
                    self.transport.write(chunk(result.farewell()))
                self.transport.write(LAST_CHUNK)
        finally:
            self.close()

    def _finish(self, response: Response, keep_alive: bool, head_only: bool):
        self.last_active = now = self.loop.time()
        keep_alive = keep_alive and not self.server.closing
        wire = response.wire.get((keep_alive, head_only))
        self.transport.write(wire if wire is not None else
                             self._render(response, keep_alive=keep_alive, head_only=head_only))
        self.request = None
        if not keep_alive:
            self.linger()
            return
        self.phase = _HEAD if self.buf else _IDLE
        if not self.write_paused:
            self._arm_idle(now)

    def _render(self, response: Response, *, keep_alive: bool, head_only: bool = False) -> bytes:
        wire = response.wire.get((keep_alive, head_only))
        if wire is None:
            headers = [("Content-Type", response.content_type), *response.headers]
            wire = response_head(response.status, headers, length=len(response.body), keep_alive=keep_alive)
            if not head_only:
                wire += response.body
            response.wire[(keep_alive, head_only)] = wire
        return wire

    def _send(self, response: Response, *, keep_alive: bool, head_only: bool = False):
        self.transport.write(self._render(response, keep_alive=keep_alive, head_only=head_only))


class ApiServer:
    """Owns the listening socket and the set of connections; ``app(request)`` answers.
    ``app.hot(head, caller)``, where the app has it, answers a request head it has seen
    before without a parse: (response, keep_alive, head_only), or None."""

    def __init__(self, app, options: ServerOptions):
        self.app = app
        self.hot = getattr(app, "hot", None)
        self.options = options
        self.loop = None
        self.connections: set[Connection] = set()
        self.per_user: dict[int, int] = {}
        self.closing = False
        self._servers = []
        self._drained: asyncio.Future | None = None     # stop(): the last connection is gone

    def admit(self, conn: Connection) -> bool:
        """Take ``conn`` (a caller with a role), making room if a bound is reached: the
        caller's own cheapest connection when it is at its per-user bound, else one of
        whoever holds the most connections (more than the newcomer would), so holding
        connections open costs the holder. Root may also take the reserved slots."""
        if self.closing:
            return False
        uid, opts = conn.caller.uid, self.options
        if uid != 0 and self.per_user.get(uid, 0) >= opts.max_connections_per_user:
            if not self._make_room({uid}):
                return False
        held = len(self.connections) - (0 if uid == 0 else self.per_user.get(0, 0))
        limit = opts.max_connections - (0 if uid == 0 else min(opts.root_reserved, opts.max_connections - 1))
        if held >= limit:
            mine = self.per_user.get(uid, 0) + 1
            holders = sorted((n, u) for u, n in self.per_user.items() if u not in (0, uid) and n > mine)
            if not any(self._make_room({u}) for _, u in reversed(holders)):
                if uid != 0 or not self._make_room(set(self.per_user) - {0}):
                    return False
        self.connections.add(conn)
        self.per_user[uid] = self.per_user.get(uid, 0) + 1
        return True

    def _make_room(self, uids: set[int]) -> bool:
        """Evict the cheapest connection of ``uids`` (idle before half-sent before streams,
        the longest unused first); False if every one is answering a request."""
        best = None
        for c in self.connections:
            if c.caller.uid in uids:
                rank = c.evictable()
                if rank is not None and (best is None or (rank, c.last_active) < best[0]):
                    best = ((rank, c.last_active), c)
        if best is None:
            return False
        victim = best[1]
        log.info("closing a connection of %s to serve another caller", victim.caller.describe())
        victim.evict()
        return True

    def release(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            uid = conn.caller.uid
            left = self.per_user.get(uid, 1) - 1
            if left:
                self.per_user[uid] = left
            else:
                self.per_user.pop(uid, None)
            if not self.connections and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    async def start(self, *socks) -> None:
        """Serve on already bound and listening UNIX sockets (the API's, and root's own)."""
        self.loop = asyncio.get_running_loop()
        self._servers = [await self.loop.create_unix_server(lambda: Connection(self), sock=sock)
                         for sock in socks]

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting; end idle connections and streams (each with its last chunk); let
        requests in flight finish; then wait (a second at most) for what was written to
        reach the clients."""
        self.closing = True
        for server in self._servers:
            server.close()
        busy = []
        for conn in list(self.connections):
            if conn.task is not None and not conn.task.done():
                if conn.streaming:
                    conn.task.cancel()
                busy.append(conn.task)
            else:
                conn.close()
        if busy:
            await asyncio.wait(busy, timeout=grace)
        for conn in list(self.connections):
            conn.close()
            conn.transport.close()          # lingering ones too
        # A closed transport flushes its buffer, then calls connection_lost (which removes
        # the connection); a client that does not read is not waited for long.
        if self.connections:
            self._drained = self.loop.create_future()
            await asyncio.wait([self._drained], timeout=1.0)

