"""Allocations against what an operator (a member of the API's group) sends and what a
damaged checkpoint holds: a flood of large allocations never costs anyone else's allocation
at the next start, an operator's id never takes a plugin's spec file or id, and a
checkpoint that really is damaged keeps what it can, holds back the devices the rest may
hold, and says so everywhere until an admin decides."""

import http.client
import json
import os
import socket
import subprocess

import pytest

from hostagent.daemon import checkpoint
from hostagent.daemon.allocations import MAX_ENTRY_BYTES
from hostagent.errors import HostagentError
from tests.programs import script

from .agentd import existing_group, make_root, running_agent
from .otheruser import in_child_as

pytestmark = [pytest.mark.root("callers of other uids are processes that root starts as nobody")]

NOBODY = 65534
GROUP, GID = existing_group()           # the socket's group: its members are operators


def as_operator(agent, requests) -> list[tuple[int, dict]]:
    """(status, body) of each (method, path, body bytes) sent by a member of the agent's
    group (nobody, in its group), each on its own connection, bodies sent as given (UTF-8,
    not escaped: what a caller may send within the body limit)."""
    def send():
        out = []
        for method, path, body in requests:
            conn = _Unix(str(agent.socket))
            conn.request(method, path, body, {"Content-Type": "application/json"} if body else {})
            resp = conn.getresponse()
            out.append([resp.status, json.loads(resp.read() or b"{}")])
            conn.close()
        return out
    return [tuple(x) for x in in_child_as(send, NOBODY, GID)]


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(self.path)


def create(alloc_id: str, device: str, labels: dict) -> tuple:
    body = json.dumps({"id": alloc_id, "devices": [{"device": device}], "labels": labels}, ensure_ascii=False)
    return ("POST", "/v1/allocations", body.encode())


def release(alloc_id: str) -> tuple:
    return ("DELETE", f"/v1/allocations/{alloc_id}", None)


@pytest.fixture
def agent():
    with running_agent(make_root(), {"api": {"group": GROUP}, "daemon": {"resync_interval": 0}}) as proc:
        yield proc


def check(agent) -> subprocess.CompletedProcess:
    return subprocess.run([script("hostagentd"), "--simulate", str(agent.root), "--config", str(agent.config),
                           "--check"], capture_output=True, text=True, timeout=60)


def test_an_operators_flood_never_costs_roots_allocation(agent):
    """The attack: 24 create-and-release cycles of an allocation carrying 32 labels of 1024
    emoji (131 KB as sent, 393 KB escaped in a journal line), then a restart. Each such
    allocation is refused; a flood of the largest allowed ones keeps the journal compacted;
    root's allocation is there after the restart."""
    with agent.client() as c:
        root_alloc = c.allocate("roots-own", ["0"])
    emoji = {f"label-{i}": "\U0001F600" * 1024 for i in range(32)}
    answers = as_operator(agent, [r for n in range(24) for r in (create(f"flood-{n}", "1", emoji),
                                                                 release(f"flood-{n}"))])
    for status, body in answers[::2]:
        assert (status, body["code"]) == (400, "allocation_too_large") and "393655 bytes" in body["message"]
    assert {status for status, _ in answers[1::2]} == {404}
    # The largest labels allowed (16 KiB escaped), many times over: the journal is
    # compacted by size, so it never holds much more than COMPACT_BYTES.
    largest = {f"label-{i}": "\U0001F600" * 84 for i in range(16)}
    sizes = []
    for batch in range(6):
        answers = as_operator(agent, [r for n in range(20) for r in (create(f"big-{batch}-{n}", "1", largest),
                                                                     release(f"big-{batch}-{n}"))])
        assert {s for s, _ in answers[::2]} == {201} and {s for s, _ in answers[1::2]} == {200}, answers[:2]
        sizes.append(checkpoint.journal_path(agent.host).stat().st_size)
    assert max(sizes) <= checkpoint.COMPACT_BYTES + MAX_ENTRY_BYTES, sizes
    agent.stop()
    agent.start()
    with agent.client() as c:
        assert [a["id"] for a in c.allocations()] == ["roots-own"]
        assert c.allocation("roots-own")["devices"] == root_alloc["devices"]
        assert c.node()["checkpoint"] == {"state": "ok", "unreadable": [], "held_devices": []}
    assert "unreadable" not in agent.log()


def shared(alloc_id: str, labels: dict) -> tuple:
    body = {"id": alloc_id, "devices": [{"device": "1"}], "sharing": {"strategy": "TimeSlicing"}, "labels": labels}
    return ("POST", "/v1/allocations", json.dumps(body).encode())


def test_a_callers_allocations_are_bounded_so_others_still_get_theirs(agent):
    agent.write_config({"api": {"group": GROUP}, "daemon": {"resync_interval": 0},
                        "allocations": {"max_per_caller": 6, "max_bytes_per_caller": 65536}})
    agent.stop()
    agent.start()
    answers = as_operator(agent, [shared(f"mine-{n}", {"pod": "p"}) for n in range(7)])
    assert [s for s, _ in answers] == [201] * 6 + [409]
    assert answers[6][1]["code"] == "allocation_limit_reached" and "allocations.max_per_caller" in answers[6][1]["message"]
    with agent.client() as c:                    # root is not bound by it
        for n in range(3):
            c.allocate(f"roots-{n}", ["1"], sharing={"strategy": "TimeSlicing"})
    assert {s for s, _ in as_operator(agent, [release(f"mine-{n}") for n in range(6)])} == {200}
    bulky = {f"l{i}": "x" * 1000 for i in range(15)}     # 15 KB an entry: four fit in 64 KiB, not five
    answers = as_operator(agent, [shared(f"bulky-{n}", bulky) for n in range(5)])
    assert [s for s, _ in answers] == [201] * 4 + [409]
    assert "allocations.max_bytes_per_caller (65536)" in answers[4][1]["message"]


def test_an_operators_id_never_takes_a_plugins(agent):
    """An operator's ``k8s-dra_<uid>`` (the claim's id with ``_``, once the same spec file
    name) does not block the DRA plugin's ``k8s-dra/<uid>``, nor the device plugin's; and
    the plugins' prefixes themselves are theirs."""
    uid = "0b7e5c1e-1f0a-4c51-9a57-28f4c1d6b2c3"
    dp = "k8s-device-plugin/nvidia.com/gpu/9f2c0e55aa01b3c4"
    answers = as_operator(agent, [create(f"k8s-dra_{uid}", "1", {}), create(dp.replace("/", "_"), "2", {}),
                                  create(f"k8s-dra/{uid}", "3", {}), create(dp, "3", {})])
    assert [s for s, _ in answers[:2]] == [201, 201], answers[:2]
    assert [(s, b["code"]) for s, b in answers[2:]] == [(403, "reserved_id")] * 2
    with agent.client() as c:
        claim = c.allocate(f"k8s-dra/{uid}", ["4"])
        container = c.allocate(dp, ["5"], cdi_names="allocation")
        ids = {a["id"]: a for a in c.allocations()}
    assert set(ids) == {f"k8s-dra_{uid}", dp.replace("/", "_"), f"k8s-dra/{uid}", dp}
    files = {a["id"]: a["spec_path"] for a in ids.values()}
    assert len(set(files.values())) == 4 and all(os.path.exists(f) for f in files.values())
    names = [n for a in ids.values() for n in a["cdi_devices"]]
    assert len(names) == len(set(names)) == 4
    assert claim["cdi_devices"][0].endswith(f"=k8s-dra_{uid}-gpu4")      # CDI's own form for a claim
    assert container["cdi_devices"] != ids[dp.replace("/", "_")]["cdi_devices"]


def damage_line_of(path, alloc_id: str) -> None:
    """A byte in the middle of the journal line that records ``alloc_id`` made a NUL: what a
    disk's damage, not a crash (which cuts only the last line), leaves."""
    lines = path.read_bytes().split(b"\n")
    [i] = [n for n, line in enumerate(lines) if f'"id":"{alloc_id}"'.encode() in line]
    lines[i] = lines[i][:40] + b"\0" + lines[i][41:]
    path.write_bytes(b"\n".join(lines))


def test_a_damaged_checkpoint_keeps_what_it_can_and_holds_the_rest_until_an_admin_decides(agent):
    with agent.client() as c:
        c.allocate("first", ["0"])                       # the first save: a snapshot
        second = c.allocate("second", ["1"])             # a journal line
        c.allocate("third", ["2"])
    held = second["devices"]
    agent.stop()
    damage_line_of(checkpoint.journal_path(agent.host), "second")
    agent.start()
    with agent.client() as c:
        assert sorted(a["id"] for a in c.allocations()) == ["first", "third"]
        view = c.node()["checkpoint"]
        assert view["state"] == "damaged" and view["held_devices"] == held
        [record] = view["unreadable"]
        assert record["devices"] == held and os.path.exists(record["kept_as"])
        assert "hostagent_checkpoint_unreadable_records 1.0" in c.metrics()
        with pytest.raises(HostagentError) as e:
            c.allocate("again", ["1"])
        assert e.value.code == "device_not_allocatable" and "could not read may hold it" in e.value.message
        c.allocate("elsewhere", ["3"])
    assert "allocations checkpoint: a record cannot be read (journal line" in agent.log()
    done = check(agent)
    assert done.returncode == 1 and "its allocations checkpoint is damaged: 1 unreadable record(s)" in done.stderr
    assert held[0] in done.stderr
    # A restart keeps it so: the checkpoint is whole again, the record stays until dismissed.
    agent.stop()
    agent.start()
    with agent.client() as c:
        assert c.node()["checkpoint"]["held_devices"] == held
    [(status, body)] = as_operator(agent, [("DELETE", "/v1/checkpoint/unreadable", None)])
    assert (status, body["code"]) == (403, "forbidden")
    done = subprocess.run([script("hostagent"), "--simulate", str(agent.root), "allocations", "dismiss-unreadable"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "dismissed: journal line" in done.stdout, done.stderr
    with agent.client() as c:
        assert c.node()["checkpoint"]["state"] == "ok"
        assert "hostagent_checkpoint_unreadable_records 0.0" in c.metrics()
        c.allocate("again", ["1"])
    assert check(agent).returncode == 0
    assert "dismissed by uid 0" in agent.log()


MODES = {"version": "v1", "mig-configs": {"modes": [{"devices": [0], "mig-enabled": True, "mig-devices": {}},
                                                   {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]}}


def test_what_an_unreadable_record_may_own_is_kept_until_an_admin_dismisses_it(agent):
    """A claim's record (its own MPS daemon on a MIG device made for it, its spec) damaged
    on disk: the start keeps the daemon serving and the spec, where it stopped the daemon as
    an orphan and removed the spec before; once the record is dismissed, the next start
    takes them away."""
    from hostagent.processes import ProcessRecord, current
    with agent.client(timeout=None) as c:
        c.mig_apply("modes", spec=MODES)
        c.allocate("first", ["5"])
        claim = c.allocate("claim", [{"mig": {"gpu": "0", "profile": "2g.10gb", "start": 0},
                                      "sharing": {"strategy": "MPS"}}], own_mps_daemon=True)
    daemon, [mig] = ProcessRecord.from_dict(claim["mps"]["process"]), claim["devices"]
    agent.stop()
    damage_line_of(checkpoint.journal_path(agent.host), "claim")
    agent.start()
    with agent.client() as c:
        assert [a["id"] for a in c.allocations()] == ["first"] and mig in c.node()["checkpoint"]["held_devices"]
        assert mig in {m["uuid"] for m in c.devices(type="mig")["mig_devices"]}
    assert current(daemon) and os.path.exists(claim["spec_path"])
    assert f"MPS daemon {claim['mps']['key']} kept" in agent.log() and "no allocation has it" in agent.log()
    done = subprocess.run([script("hostagent"), "--simulate", str(agent.root), "allocations", "dismiss-unreadable"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    agent.stop()
    agent.start()
    assert not current(daemon) and not os.path.exists(claim["spec_path"])
    with agent.client() as c:
        c.request("DELETE", f"/v1/mig/instances/{mig}")     # the admin's, now: a device like any other
