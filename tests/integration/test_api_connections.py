"""Connection accounting: root and authorised callers are always served, whoever holds
connections open. Callers run as forked children under other uids (root needed); the
daemon runs with small bounds so the attack takes a few connections, not hundreds."""

import json
import os
import select
import socket
from types import SimpleNamespace

import pytest

from hostagent.api.server import ApiServer, ServerOptions

from .agentd import existing_group, make_root, running_agent

OTHER_GID = 23456
OPERATORS = (65534, 23001, 23002, 23003)        # members of the API's group (primary gid)
BOUNDS = {"max_connections": 12, "root_reserved_connections": 4, "max_connections_per_user": 5}


def request(path: str, target: str = "/v1/node") -> tuple[int, str | None]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    s.sendall(f"GET {target} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        code = json.loads(body).get("code")
    except ValueError:
        code = None
    return (int(head.split()[1]) if head else 0), code


def ended(s: socket.socket) -> bool:
    """Whether the daemon closed ``s`` (after an answer such as a 503, or none)."""
    while True:
        ready, _, _ = select.select([s], [], [], 0.5)
        if not ready:
            return False
        try:
            if s.recv(65536, socket.MSG_DONTWAIT) == b"":
                return True
        except ConnectionResetError:
            return True


class Holder:
    """A child under ``uid`` holding ``count`` idle connections until told to report which
    the daemon closed (or asked, with ``then``, to make one request afterwards)."""

    def __init__(self, agent, uid, count, gid=None, then=False):
        gid = agent.api_gid if gid is None else gid
        self.r, w = os.pipe()
        self.go_r, self.go_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            status = 1
            try:
                os.close(self.r)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                held = []
                for _ in range(count):
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(str(agent.socket))
                    held.append(s)
                os.write(w, b"ready\n")
                os.read(self.go_r, 1)
                answer = request(str(agent.socket)) if then else None
                closed = sum(ended(s) for s in held)
                os.write(w, json.dumps({"closed": closed, "answer": answer}).encode())
                status = 0
            finally:
                os._exit(status)
        os.close(w)
        assert os.read(self.r, 6) == b"ready\n"

    def report(self) -> dict:
        os.write(self.go_w, b"g")
        with os.fdopen(self.r, "rb") as f:
            data = json.loads(f.read())
        os.waitpid(self.pid, 0)
        return data


@pytest.fixture(scope="module")
def agent():
    if os.geteuid() != 0:
        pytest.skip("needs root to run callers under other uids")
    group, gid = existing_group()
    with running_agent(make_root(), {"api": {"group": group, "socket_mode": "0666", **BOUNDS},
                                     "daemon": {"resync_interval": 0}}) as proc:
        proc.api_gid = gid
        yield proc


def test_operators_hoarding_every_slot_cannot_lock_out_root_or_each_other(agent):
    holders = [Holder(agent, uid, BOUNDS["max_connections_per_user"]) for uid in OPERATORS[:3]]
    try:
        # 15 asked for against 8 non-root slots: each later holder took from the biggest.
        assert request(str(agent.socket)) == (200, None)                 # root
        newcomer = Holder(agent, OPERATORS[3], 0, then=True).report()
        assert tuple(newcomer["answer"]) == (200, None)                  # another operator
    finally:
        reports = [h.report() for h in holders]
    slots = BOUNDS["max_connections"] - BOUNDS["root_reserved_connections"]
    kept = [5 - r["closed"] for r in reports]
    assert sum(kept) <= slots - 1                    # the newcomer's connection was made room for
    assert min(kept) >= 2, kept                      # shares even out: nobody is starved


def test_a_user_at_its_bound_pays_with_its_own_idle_connection(agent):
    holder = Holder(agent, OPERATORS[1], BOUNDS["max_connections_per_user"], then=True)
    report = holder.report()
    assert tuple(report["answer"]) == (200, None)
    assert report["closed"] >= 1


def test_callers_without_a_role_are_refused_at_accept_and_hold_nothing(agent):
    outsider = Holder(agent, 24001, 40, gid=OTHER_GID, then=True)    # 40 connections, more than the daemon has
    try:
        assert request(str(agent.socket)) == (200, None)
        operator = Holder(agent, OPERATORS[2], 0, then=True).report()
        assert tuple(operator["answer"]) == (200, None)
    finally:
        report = outsider.report()
    assert tuple(report["answer"]) == (403, "forbidden")
    assert report["closed"] == 40                                      # each closed at once


def test_a_watch_given_up_for_a_newcomer_ends_with_its_last_line(agent):
    """A user whose every slot is a watch stream: its next request is served, and the
    stream that made room ends cleanly (the 'stopping' line, then the closing chunk), so
    the watcher knows to resume with ?since=."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(agent.api_gid)
            os.setuid(OPERATORS[2])
            streams = []
            for _ in range(BOUNDS["max_connections_per_user"]):
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(10)
                s.connect(str(agent.socket))
                s.sendall(b"GET /v1/watch HTTP/1.1\r\n\r\n")
                assert s.recv(65536).startswith(b"HTTP/1.1 200")
                streams.append(s)
            answer = request(str(agent.socket))
            ended = []
            for s in streams:
                s.settimeout(0.5)
                data = b""
                try:
                    while chunk := s.recv(65536):
                        data += chunk
                    ended.append(data.decode(errors="replace"))
                except socket.timeout:
                    pass
            os.write(w, json.dumps({"answer": answer, "ended": ended}).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = json.loads(f.read())
    os.waitpid(pid, 0)
    assert tuple(report["answer"]) == (200, None)
    assert len(report["ended"]) == 1, report["ended"]
    assert '"type":"stopping"' in report["ended"][0] and report["ended"][0].endswith("0\r\n\r\n")


# -- the admission rule itself, on stand-in connections (no sockets) -------------------

@pytest.fixture
def server():
    return ApiServer(None, ServerOptions(max_connections=6, max_connections_per_user=3, root_reserved=2))


class Stand:
    """A connection of ``uid`` as admission sees it: ``rank`` is what Connection.evictable()
    would give (None: answering a request)."""

    def __init__(self, server, uid, rank, last):
        self.server, self.rank, self.last_active, self.evicted = server, rank, last, False
        self.caller = SimpleNamespace(uid=uid, describe=lambda: f"uid {uid}")

    def evictable(self):
        return self.rank

    def evict(self):
        self.evicted = True
        self.server.release(self)


def conn(server, uid, rank=0, last=0.0):
    return Stand(server, uid, rank, last)


def test_admission_takes_from_the_biggest_holder_and_never_from_busy_requests(server):
    a = [conn(server, 1, last=i) for i in range(3)]
    busy = conn(server, 2, rank=None)
    for c in a + [busy]:
        assert server.admit(c)
    assert server.admit(conn(server, 3))                 # the non-root slots are full: uid 1 pays
    assert [c.evicted for c in a] == [True, False, False] and not busy.evicted
    assert server.admit(conn(server, 0)) and server.admit(conn(server, 0))      # root's reserve
    assert len(server.connections) == 6


def test_admission_refuses_only_when_every_slot_is_answering(server):
    for uid in (1, 1, 2, 2):
        assert server.admit(conn(server, uid, rank=None))
    assert not server.admit(conn(server, 3))             # nothing can be taken
    assert server.admit(conn(server, 0)) and server.admit(conn(server, 0))      # root still is served
    assert not server.admit(conn(server, 0))             # but never past every slot


def test_a_holder_gives_up_idle_then_half_sent_connections_then_streams(server):
    stream, half, idle = conn(server, 1, rank=2, last=0), conn(server, 1, rank=1, last=5), conn(server, 1, rank=0, last=9)
    for c in (stream, half, idle):
        assert server.admit(c)
    assert server.admit(conn(server, 1, rank=None))      # at its own bound: its idle one pays
    assert idle.evicted and not half.evicted and not stream.evicted
    assert server.admit(conn(server, 1, rank=None))
    assert half.evicted and not stream.evicted
    assert server.admit(conn(server, 1, rank=None))
    assert stream.evicted
    assert not server.admit(conn(server, 1, rank=None))  # all three answering: refused
