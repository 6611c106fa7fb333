"""A small client of the agent's local API, over a pluggable transport.

    Client                 policy: paths, JSON, errors mapped to hostagent's hierarchy
      └── Transport        I/O: ``handle_request(Request) -> Response``, ``close()``
          ├── UnixSocketTransport   HTTP/1.1 on the agent's UNIX socket (keep-alive)
          └── HandlerTransport      a function answers: tests without a socket

Error responses become the matching ``HostagentError`` subclass carrying the server's
stable ``code``; a socket nobody listens on becomes ``DaemonNotRunning``. Answers are the
device model's documents (``hostagent.model``, the components of ``api/openapi.json``), as
plain dicts. Standard library only, so the CLI can use it without slowing its start.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

from .errors import (ConflictError, HostagentError, NotFoundError, PermissionDenied, UnknownName,
                     UnavailableError, UsageError)

__all__ = ["Client", "Request", "Response", "Transport", "UnixSocketTransport", "HandlerTransport",
           "DaemonNotRunning", "ApiError", "DEFAULT_SOCKET", "ADMIN_SOCKET", "admin_socket", "daemon_running"]

DEFAULT_SOCKET = "/run/hostagent/hostagent.sock"
ADMIN_SOCKET = "admin.sock"       # root's own socket, beside the API socket (0600 root)
CONNECT_RETRY = 0.01              # seconds between tries while the socket's accept queue is full


def admin_socket(path: str | os.PathLike) -> str:
    """The root-only socket the daemon serves beside the API socket ``path``: other users
    cannot connect to it, so they cannot fill its accept queue."""
    return os.path.join(os.path.dirname(os.fspath(path)), ADMIN_SOCKET)
_MAX_HEAD = 65536


class DaemonNotRunning(UnavailableError):
    code = "daemon_not_running"


class ApiError(HostagentError):
    """An error response the status does not map to a narrower class."""


_BY_STATUS = {400: UsageError, 403: PermissionDenied, 404: NotFoundError, 409: ConflictError,
              422: UsageError, 503: UnavailableError}


@dataclass
class Request:
    method: str
    path: str                          # with the query string
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: object = None              # for streamed bodies: an iterator of byte chunks

    def json(self):
        return json.loads(self.body)

    def lines(self):
        """The body's lines, as they arrive for a stream."""
        if self.stream is None:
            yield from (line for line in self.body.splitlines() if line)
            return
        pending = b""
        for data in self.stream:
            pending += data
            *complete, pending = pending.split(b"\n")
            yield from (line for line in complete if line)
        if pending:
            yield pending


class Transport:
    def handle_request(self, request: Request) -> Response:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HandlerTransport(Transport):
    """``handler(request) -> Response`` answers every request (no socket, no server)."""

    def __init__(self, handler):
        self.handler = handler

    def handle_request(self, request: Request) -> Response:
        return self.handler(request)


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def until(self, marker: bytes, limit: int) -> bytes:
        while marker not in self.buf:
            if len(self.buf) > limit or not self.fill():
                raise ConnectionError("the agent closed the connection mid-response")
        head, self.buf = self.buf.split(marker, 1)
        return head

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self.fill():
                raise ConnectionError("the agent closed the connection mid-response")
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def chunks(self):
        while True:
            size = int(self.until(b"\r\n", _MAX_HEAD).split(b";")[0], 16)
            if size == 0:
                self.until(b"\r\n", _MAX_HEAD)
                return
            data = self.exactly(size)
            self.exactly(2)
            yield data


# A stream's reads wait this many heartbeat intervals: one late heartbeat on a busy host is
# no reason to give up, several missing ones mean the agent is gone or wedged.
HEARTBEATS_MISSED = 3
DEFAULT_HEARTBEAT = 30.0      # the agent's api.watch_heartbeat default, when it does not say


class UnixSocketTransport(Transport):
    """HTTP/1.1 over the agent's socket, one kept-alive connection reused (re-opened when
    the agent closed it). Streamed responses take the connection with them.

    ``timeout`` bounds each wait for an answer; a stream's reads have their own bound,
    ``stream_timeout``, by default three of the heartbeat intervals the agent announces
    with the stream (``Hostagent-Heartbeat``): an idle watch is quiet between heartbeats
    by design, so the request timeout must not apply to it."""

    def __init__(self, path: str | os.PathLike = DEFAULT_SOCKET, timeout: float | None = 30.0,
                 stream_timeout: float | None = None):
        self.path = os.fspath(path)
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self._sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        """Root goes through the root-only socket when the daemon has one (other users'
        connections cannot crowd it); everyone else, and root without it, through ``path``."""
        if os.geteuid() == 0:
            admin = admin_socket(self.path)
            if admin != self.path and os.path.exists(admin):
                try:
                    return self._open(admin)
                except (DaemonNotRunning, PermissionDenied):
                    pass
        return self._open(self.path)

    def _open(self, path: str) -> socket.socket:
        """A connection to ``path``; while its accept queue is full (EAGAIN), tried again
        until the timeout."""
        deadline = time.monotonic() + (self.timeout if self.timeout is not None else 30.0)
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.settimeout(self.timeout)
            try:
                sock.connect(path)
                return sock
            except OSError as e:
                sock.close()
                if e.errno == errno.EAGAIN and time.monotonic() < deadline:
                    time.sleep(CONNECT_RETRY)
                    continue
                if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
                    raise DaemonNotRunning("the hostagent daemon is not running", where=path,
                                           hint="start it: systemctl start hostagent") from None
                if e.errno == errno.EACCES:
                    raise PermissionDenied("no permission to connect to the agent's socket",
                                           where=path, hint=_socket_access_hint(path)) from None
                if e.errno == errno.EAGAIN:
                    raise UnavailableError("the agent's socket accepts no connection (its queue is full)",
                                           where=path, hint="try again; see who floods it") from None
                raise UnavailableError(f"cannot connect to the agent: {e.strerror}", where=path) from None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _stream_wait(self, headers: dict) -> float | None:
        if self.stream_timeout is not None:
            return self.stream_timeout
        try:
            heartbeat = float(headers.get("hostagent-heartbeat", DEFAULT_HEARTBEAT))
        except ValueError:
            heartbeat = DEFAULT_HEARTBEAT
        return HEARTBEATS_MISSED * heartbeat

    def _send(self, request: Request, sock: socket.socket) -> None:
        body = request.body or b""
        headers = {"Host": "localhost", "Accept": "application/json", **request.headers}
        if request.body is not None:
            headers.setdefault("Content-Type", "application/json")
            headers["Content-Length"] = str(len(body))
        head = f"{request.method} {request.path} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode("latin-1") + body)

    def handle_request(self, request: Request) -> Response:
        reused = self._sock is not None
        sock = self._sock or self._connect()
        self._sock = None
        try:
            self._send(request, sock)
            reader = _Reader(sock)
            head = reader.until(b"\r\n\r\n", _MAX_HEAD)
        except (ConnectionError, BrokenPipeError) as e:
            sock.close()
            if reused:      # the agent closed an idle kept-alive connection: once more, afresh
                return self.handle_request(request)
            raise UnavailableError(f"the agent dropped the connection: {e}", where=self.path) from None
        except socket.timeout:
            sock.close()
            raise UnavailableError("the agent did not answer in time", where=self.path) from None
        status_line, *lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers = {}
        for line in lines:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            wait = self._stream_wait(headers)
            sock.settimeout(wait)

            def stream():
                try:
                    yield from reader.chunks()
                except socket.timeout:
                    raise UnavailableError(f"the agent sent nothing (not even a heartbeat) for {wait:g} s",
                                           where=self.path, hint="is the daemon running? watch again with since=") from None
                except (ConnectionError, ValueError) as e:
                    raise UnavailableError(f"the agent's stream broke off: {e}", where=self.path,
                                           hint="watch again with since= the last revision") from None
                finally:
                    sock.close()
            return Response(status, headers, stream=stream())
        bodiless = request.method == "HEAD" or status in (204, 304) or status < 200
        body = b"" if bodiless else reader.exactly(int(headers.get("content-length", 0)))
        if headers.get("connection", "").lower() == "close":
            sock.close()
        else:
            self._sock = sock
        return Response(status, headers, body)


def _error(response: Response) -> HostagentError:
    try:
        data = response.json()
        code, message, details = data["code"], data["message"], data.get("details") or {}
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", f"HTTP {response.status}", {}
    cls = _BY_STATUS.get(response.status, ApiError)
    if cls is NotFoundError and "name" in details:
        cls = UnknownName
    error = cls(message, **({"name": details["name"]} if cls is UnknownName else {}))   # the message names the hint
    error.details = details
    error.code = code          # the server's stable code, more precise than the class's
    error.status = response.status
    return error


class Client:
    """``Client()`` talks to the local daemon; ``Client(transport=...)`` to anything else."""

    def __init__(self, transport: Transport | None = None, socket_path: str | os.PathLike | None = None,
                 timeout: float | None = 30.0, stream_timeout: float | None = None):
        """``timeout``: seconds to wait for an answer (None: forever; a MIG apply can take
        minutes); ``stream_timeout``: seconds a watch may stay silent (default: three of the
        agent's heartbeat intervals)."""
        self.transport = transport or UnixSocketTransport(socket_path or DEFAULT_SOCKET, timeout,
                                                          stream_timeout)

    @classmethod
    def for_host(cls, host, **kw) -> "Client":
        """The daemon of a HostRoot (a simulated node's socket lives under its root)."""
        return cls(socket_path=host.host(DEFAULT_SOCKET), **kw)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, method: str, path: str, body=None, query: dict | None = None,
                headers: dict | None = None) -> Response:
        query = {k: v for k, v in (query or {}).items() if v is not None}
        if query:
            path += "?" + urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        response = self.transport.handle_request(Request(method, path, data, dict(headers or {})))
        if response.status >= 400:
            raise _error(response)
        return response

    def get(self, path: str, **query):
        return self.request("GET", path, query=query).json()

    # ---- the API ------------------------------------------------------------------

    def live(self) -> dict:
        """``GET /v1/live``: whether the agent's work moves (an error coded ``stuck`` if not)."""
        return self.get("/v1/live")

    def node(self) -> dict:
        """``Node``."""
        return self.get("/v1/node")

    def devices(self, type: str | None = None, profiles: bool = False) -> dict:
        """``DeviceList``: ``gpus`` (``Gpu``) and ``mig_devices`` (``MigDevice``); with
        ``profiles``, each GPU's MIG profiles in ``mig.profiles``."""
        return self.get("/v1/devices", type=type, profiles="true" if profiles else None)

    def device(self, ident: str) -> dict:
        """A ``Gpu`` or ``MigDevice`` by index, UUID, MIG name (``0:1``) or CDI name."""
        return self.get("/v1/devices/" + quote(str(ident), safe=""))

    def topology(self, gpus=None) -> dict:
        """How the GPUs are connected (``GET /v1/topology``); ``gpus``: indices or UUIDs."""
        return self.get("/v1/topology", gpus=",".join(map(str, gpus)) if gpus else None)

    def allocations(self) -> list[dict]:
        return self.get("/v1/allocations")["allocations"]

    def allocation(self, alloc_id: str) -> dict:
        return self.get("/v1/allocations/" + quote(alloc_id, safe=""))

    def allocate(self, alloc_id: str, devices: list, sharing: dict | None = None,
                 labels: dict | None = None, cdi_names: str | None = None, replaces=(),
                 edits: bool = True, own_mps_daemon: bool = False) -> dict:
        """``devices``: names ("0", a UUID, "0:1", a CDI name), ``{"constraints": {...},
        "count": n}`` or ``{"mig": {"gpu", "profile", "start"}}`` items (each named item may
        carry its own ``sharing``); ``cdi_names``: ``node`` for the node spec's names and no
        transient spec (the agent's default: ``allocation``); ``replaces``: ids of
        allocations to release in the same commit; ``edits=False``: the answer without its
        ``container_edits`` (``Prefer: return=minimal``), for callers that hand on CDI names;
        ``own_mps_daemon``: an MPS control daemon of its own for its MPS devices the node
        does not share (root, or a uid of ``api.plugin_uids``)."""
        items = [d if isinstance(d, dict) else {"device": str(d)} for d in devices]
        body = {"id": alloc_id, "devices": items}
        if sharing:
            body["sharing"] = sharing
        if cdi_names:
            body["cdi_names"] = cdi_names
        if replaces:
            body["replaces"] = list(replaces)
        if labels:
            body["labels"] = labels
        if own_mps_daemon:
            body["own_mps_daemon"] = True
        return self.request("POST", "/v1/allocations", body,
                            headers=None if edits else {"Prefer": "return=minimal"}).json()

    def pass_through(self, alloc_id: str, gpus: list[str], iommufd: bool = False,
                     labels: dict | None = None, replaces=()) -> dict:
        """An allocation passing ``gpus`` (index, UUID or PCI bus id) through to a VM: each
        GPU and its IOMMU group on vfio-pci until it is released; its CDI names give the
        group's /dev/vfio nodes (``iommufd``: and /dev/iommu with the VFIO cdevs, where the
        node has them); ``replaces``: allocations released in the same commit (a GPU one of
        them passes through stays on vfio-pci). Root, or a uid of ``api.plugin_uids``."""
        items = [{"passthrough": {"gpu": str(g), **({"iommufd": True} if iommufd else {})}} for g in gpus]
        return self.allocate(alloc_id, items, labels=labels, replaces=replaces)

    def release(self, alloc_id: str, missing_ok: bool = False) -> dict | None:
        """The released allocation. An unknown id is NotFoundError (code not_found), or
        None with ``missing_ok``: a retried release (kubelet retries unprepare) is done."""
        try:
            return self.request("DELETE", "/v1/allocations/" + quote(alloc_id, safe="")).json()
        except NotFoundError as e:
            if missing_ok and e.code == "not_found":
                return None
            raise

    def preferred_allocation(self, available: list[str], size: int, must_include: list[str] = (),
                             policy: str = "distributed") -> list[str]:
        """Which ``size`` of the ``available`` devices to prefer (a kubelet plugin's
        GetPreferredAllocation); changes nothing."""
        body = {"available": list(available), "size": size, "policy": policy}
        if must_include:
            body["must_include"] = list(must_include)
        return self.request("POST", "/v1/preferred-allocation", body).json()["devices"]

    def refresh(self) -> int:
        return self.request("POST", "/v1/inventory/refresh").json()["revision"]

    # ---- MIG ----------------------------------------------------------------------

    def mig(self) -> dict:
        """Each GPU's MIG mode and exact layout (``GET /v1/mig``)."""
        return self.get("/v1/mig")

    @staticmethod
    def _layout_body(config, spec, **flags) -> dict:
        body = {k: v for k, v in flags.items() if v}
        if config is not None:
            body["config"] = config
        if spec is not None:
            body["spec"] = spec
        return body

    def mig_plan(self, config: str | None = None, spec: dict | None = None, mode_only: bool = False) -> dict:
        """What applying ``config`` would change: ``{"plan": {...}, "notes": [...], "busy":
        [...]}``, ``busy`` the allocations holding devices it would take away (``id``,
        ``labels``, ``devices``). ``spec``: an inline mig-parted v1 document (default: the
        bundled config)."""
        return self.request("POST", "/v1/mig/plan", self._layout_body(config, spec, mode_only=mode_only)).json()

    def mig_apply(self, config: str | None = None, spec: dict | None = None, hooks: dict | None = None,
                  mode_only: bool = False, skip_reset: bool = False, force: bool = False,
                  dry_run: bool = False) -> dict:
        """Apply a layout (root); the answer has the plan, the GPUs ``changed`` and the
        ``revision`` to watch from. Use a client with ``timeout=None``: GPU resets take a while."""
        body = self._layout_body(config, spec, mode_only=mode_only, skip_reset=skip_reset,
                                 force=force, dry_run=dry_run)
        if hooks is not None:
            body["hooks"] = hooks
        return self.request("POST", "/v1/mig/apply", body).json()

    def mig_create_instance(self, profile: str, gpu: str | int | None = None) -> dict:
        """A new MIG device of ``profile`` (root): on ``gpu`` (index or UUID), or the best
        fitting MIG-enabled GPU. Returns the device as ``GET /v1/devices/{id}`` shows it."""
        body = {"profile": profile}
        if gpu is not None:
            body["gpu"] = str(gpu)
        return self.request("POST", "/v1/mig/instances", body).json()

    def mig_destroy_instance(self, uuid: str, force: bool = False) -> dict:
        """Destroy a MIG device by UUID (root); ``force`` terminates processes using it.
        Returns the device as it was."""
        return self.request("DELETE", "/v1/mig/instances/" + quote(uuid, safe=""),
                            query={"force": "true" if force else None}).json()

    # ---- health, labels, metrics --------------------------------------------------

    def health(self) -> dict:
        """The health monitor's records (``GET /v1/health``)."""
        return self.get("/v1/health")

    def clear_health(self, devices: list[str] | None = None) -> dict:
        """Make devices healthy now (root): the named ones, or every device (None)."""
        body = {"all": True} if devices is None else {"devices": [str(d) for d in devices]}
        return self.request("POST", "/v1/health/clear", body).json()

    def labels(self) -> dict:
        return self.get("/v1/labels")

    def driver(self) -> dict:
        """The driver readiness gate and its last verification (``GET /v1/driver``)."""
        return self.get("/v1/driver")

    def verify_driver(self) -> dict:
        """Verify the driver now (``POST /v1/driver/verify``, root)."""
        return self.request("POST", "/v1/driver/verify").json()

    def install_driver(self, version: str, force: bool = False) -> dict:
        """Have the agent install driver ``version`` (``POST /v1/driver/install``, root): the
        install's state, and ``started`` (whether this call started it)."""
        return self.request("POST", "/v1/driver/install", {"version": version, "force": force}).json()

    def driver_install(self) -> dict:
        """The install last started through the API, as it stands (``GET /v1/driver/install``)."""
        return self.get("/v1/driver/install")

    def sharing(self) -> dict:
        """``GET /v1/sharing``: what is shared, how, and each MPS daemon's state."""
        return self.get("/v1/sharing")

    def sharing_apply(self, config: dict | None, dry_run: bool = False, force: bool = False) -> dict:
        """``PUT /v1/sharing`` (root): apply a sharing config document (None: off); ``force``:
        devices in allocations may change too."""
        body = {"config": config, "dry_run": dry_run, **({"force": True} if force else {})}
        return self.request("PUT", "/v1/sharing", body).json()

    def metrics(self) -> str:
        """The Prometheus text exposition the socket serves at ``/metrics``."""
        return self.request("GET", "/metrics").body.decode()

    def watch(self, since: int | None = None, types=None, own: str | None = None):
        """Events as dicts, as they happen (a generator; close it to stop watching).
        ``types``: only these event types (the snapshot, heartbeats and stopping still come);
        ``own``: the id prefix of the caller's allocations, whose device changes are left out
        when they change nothing else."""
        response = self.request("GET", "/v1/watch", query={"since": since, "own": own,
                                                           "types": ",".join(types) if types else None})
        for line in response.lines():
            yield json.loads(line)


def _socket_access_hint(path: str) -> str:
    """Who may connect: root, and the members of the socket's group when it has one."""
    from .groups import group_name
    try:
        gid = os.stat(path).st_gid
    except OSError:
        gid = 0
    group = group_name(gid) if gid != 0 else None
    if group is None:
        return "only root may use it"
    return (f"root and the members of group '{group}' may use it; to join: "
            f"sudo usermod -aG {group} $USER, then log in again")


def daemon_running(socket_path: str | os.PathLike) -> bool:
    """Whether a daemon listens on ``socket_path`` (or, for root, on the root-only socket
    beside it): cheap, connect and close. A full accept queue means one listens."""
    paths = [os.fspath(socket_path)]
    if os.geteuid() == 0:
        paths.insert(0, admin_socket(paths[0]))
    for path in paths:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(5.0)
        try:
            sock.connect(path)
            return True
        except OSError as e:
            if e.errno == errno.EAGAIN:
                return True
        finally:
            sock.close()
    return False
