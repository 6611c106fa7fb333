"""Who may do what: callers identified by SO_PEERCRED, as processes running under other
uids and groups (the tests run as root and start children as ``nobody``)."""

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hostagent.errors import HostagentError
from tests.runfolder import readable_copy

from .agentd import existing_group, make_root, running_agent
from .otheruser import in_child_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start processes as other users")

NOBODY, OTHER_GID = 65534, 23456
API_GROUP, API_GID = existing_group()       # the socket's group (nogroup on Debian)

def _run(path, script):
    """In the child: each step on its own connection; HOLD keeps one open."""
    out, held = [], []
    for method, target, body in script:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        try:
            s.connect(path)
        except OSError as e:
            out.append(["connect", e.errno])
            continue
        if method == "HOLD":
            held.append(s)
            out.append(["held", 0])
            continue
        data = (body or "").encode()
        s.sendall(f"{method} {target} HTTP/1.1\r\nConnection: close\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        resp = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            resp += chunk
        s.close()
        head, _, payload = resp.partition(b"\r\n\r\n")
        try:
            code = json.loads(payload).get("code")
        except ValueError:
            code = None
        out.append([int(head.split()[1]) if head else 0, code])
    return out


def as_user(agent, script, uid=NOBODY, gid=API_GID, groups=()):
    """Run ``script`` in a forked child that has dropped to ``uid``/``gid``/``groups``
    (a fork, not an exec: nobody may not be able to read this interpreter)."""
    return [tuple(x) for x in in_child_as(lambda: _run(str(agent.socket), script), uid, gid, groups)]


ALLOC = json.dumps({"id": "by-nobody", "devices": [{"device": "1"}]})


@pytest.fixture(scope="module")
def group_agent():
    with running_agent(make_root(), {"api": {"group": API_GROUP, "max_connections_per_user": 3},
                                     "daemon": {"resync_interval": 0}}) as proc:
        yield proc


def test_socket_mode_and_group(group_agent):
    st = os.stat(group_agent.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    assert (st.st_uid, st.st_gid) == (0, API_GID)


def test_group_member_reads_and_allocates_but_does_not_administer(group_agent):
    got = as_user(group_agent, [
        ["GET", "/v1/node", None], ["GET", "/v1/devices", None], ["GET", "/v1/devices/1", None],
        ["GET", "/v1/openapi.json", None], ["GET", "/v1/allocations", None],
        ["POST", "/v1/allocations", ALLOC], ["GET", "/v1/allocations/by-nobody", None],
        ["POST", "/v1/inventory/refresh", None],
        ["DELETE", "/v1/allocations/by-nobody", None]])
    assert got == [(200, None), (200, None), (200, None), (200, None), (200, None),
                   (201, None), (200, None), (403, "forbidden"), (200, None)]


def test_group_member_sees_the_driver_install_but_cannot_start_one(group_agent):
    got = as_user(group_agent, [["GET", "/v1/driver/install", None],
                                ["POST", "/v1/driver/install", json.dumps({"version": "550.127.05"})]])
    assert got == [(200, None), (403, "forbidden")]
    with group_agent.client() as c:
        assert c.driver_install()["state"] == "none"                 # nothing was started


def test_an_allocation_is_its_owners_and_roots(group_agent):
    """A member may not release, take back or replace an allocation of another uid (root's,
    the device plugin's): 403 not_owner, and nothing changes; its own it may."""
    with group_agent.client() as c:
        c.allocate("roots", ["2"])
    other = json.dumps({"id": "by-nobody-2", "devices": [{"device": "2"}], "replaces": ["roots"]})
    again = json.dumps({"id": "roots", "devices": [{"device": "2"}]})
    own = json.dumps({"id": "mine", "devices": [{"device": "3"}]})
    replacing = json.dumps({"id": "mine-2", "devices": [{"device": "3"}], "replaces": ["mine"]})
    got = as_user(group_agent, [
        ["DELETE", "/v1/allocations/roots", None], ["POST", "/v1/allocations", other],
        ["POST", "/v1/allocations", again], ["POST", "/v1/allocations", own],
        ["POST", "/v1/allocations", replacing], ["GET", "/v1/allocations/mine-2", None]])
    assert got == [(403, "not_owner"), (403, "not_owner"), (403, "not_owner"), (201, None), (201, None),
                   (200, None)]
    with group_agent.client() as c:
        allocations = {a["id"]: a for a in c.allocations()}
        assert allocations["roots"]["owner"] == 0 and allocations["mine-2"]["owner"] == NOBODY
        assert "mine" not in allocations and "by-nobody-2" not in allocations
        # A member's allocation under an id root (a plugin) asks for is not handed to root.
        with pytest.raises(HostagentError) as e:
            c.allocate("mine-2", ["3"])
        assert e.value.code == "allocation_conflict" and e.value.details["owner"] == NOBODY
        c.release("mine-2")                 # root may release anyone's
        c.release("roots")


def test_the_command_line_says_whose_an_allocation_is(group_agent):
    """``hostagent allocations release`` by a member, of root's allocation: the daemon's 403
    not_owner as one line (exit 1); its own list names owners by user."""
    with group_agent.client() as c:
        c.allocate("roots-cli", ["4"])
    lines = "".join(json.dumps(["--simulate", "ROOT", "allocations", *argv]) + "\n"
                    for argv in (["release", "roots-cli"], ["list"]))
    # The command runs from a copy nobody may read: this checkout may be in a private folder.
    copy = readable_copy((Path(__file__).with_name("nonroot.py"),))
    done = subprocess.run([sys.executable, str(copy / "nonroot.py"), str(group_agent.root), str(API_GID)],
                          input=lines, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(copy)})
    assert done.returncode == 0, done.stderr
    (_, code, out), (_, listed, table) = (json.loads(line) for line in done.stdout.splitlines())
    try:
        assert code == 1 and out == ("hostagent: error: allocation(s) 'roots-cli' (uid 0) belong to another caller: "
                                     "only their owner or root may release or replace them (release your own "
                                     "allocations; root may release any); run it as root: sudo hostagent "
                                     f"--simulate {group_agent.root} allocations release roots-cli\n"), out
        assert listed == 0 and table.splitlines()[1].split()[3] == "root", table
    finally:
        with group_agent.client() as c:
            c.release("roots-cli")


def test_group_member_reads_health_labels_and_metrics_but_does_not_clear(group_agent):
    got = as_user(group_agent, [
        ["GET", "/v1/health", None], ["GET", "/v1/labels", None], ["GET", "/metrics", None],
        ["POST", "/v1/health/clear", json.dumps({"all": True})], ["GET", "/v1/sharing", None],
        ["PUT", "/v1/sharing", json.dumps({"config": None})]])
    assert got == [(200, None), (200, None), (200, None), (403, "forbidden"), (200, None), (403, "forbidden")]


def test_supplementary_group_counts(group_agent):
    got = as_user(group_agent, [["GET", "/v1/node", None], ["POST", "/v1/inventory/refresh", None]],
                  gid=OTHER_GID, groups=[API_GID])
    assert got == [(200, None), (403, "forbidden")]


def test_others_cannot_even_connect(group_agent):
    got = as_user(group_agent, [["GET", "/v1/node", None]], gid=OTHER_GID)
    assert got == [("connect", 13)]       # EACCES: the socket is 0660 root:API_GROUP


def test_per_user_connection_limit(group_agent):
    # At its bound, a user's new request is served by closing its own idle connection.
    got = as_user(group_agent, [["HOLD", None, None]] * 3 + [["GET", "/v1/node", None]])
    assert got[-1] == (200, None)
    with group_agent.client() as c:      # root is not limited per user
        assert c.node()["gpus"] == 8


def test_peer_check_stands_without_socket_permissions():
    """With a world-writable socket, everyone connects, and the peer check refuses them."""
    with running_agent(make_root(), {"api": {"group": API_GROUP, "socket_mode": "0666"},
                                     "daemon": {"resync_interval": 0}}) as agent:
        got = as_user(agent, [["GET", "/v1/node", None], ["GET", "/v1/openapi.json", None],
                              ["POST", "/v1/allocations", ALLOC], ["GET", "/v1/nothing", None]],
                      gid=OTHER_GID)
        assert got == [(403, "forbidden")] * 4
        assert as_user(agent, [["GET", "/v1/node", None]]) == [(200, None)]


MAKE = json.dumps({"id": "made-by-nobody", "devices": [{"mig": {"gpu": "0", "profile": "1g.5gb", "start": 0}}]})
OWN_MPS = json.dumps({"id": "mps-by-nobody", "devices": [{"device": "2", "sharing": {"strategy": "MPS"}}],
                      "own_mps_daemon": True})


def test_only_root_or_a_plugin_uid_may_make_mig_devices_or_mps_daemons_for_an_allocation(group_agent):
    got = as_user(group_agent, [["POST", "/v1/allocations", MAKE], ["GET", "/v1/allocations/made-by-nobody", None],
                                ["POST", "/v1/allocations", OWN_MPS], ["GET", "/v1/allocations/mps-by-nobody", None]])
    assert got == [(403, "forbidden"), (404, "not_found"), (403, "forbidden"), (404, "not_found")]
    with running_agent(make_root(), {"api": {"group": API_GROUP, "plugin_uids": [NOBODY]},
                                     "daemon": {"resync_interval": 0}}) as agent:
        # Past the check: GPU 0 is not in MIG mode.
        assert as_user(agent, [["POST", "/v1/allocations", MAKE]]) == [(409, "invalid_state")]
