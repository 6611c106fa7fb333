"""What a disk and a lock do to the daemon: its state folder full (a small tmpfs, ENOSPC),
the disk stuck under a commit, the node lock held by another process. Allocations are
refused cleanly or wait; no record is half-written; reads, the liveness probe and
``hostagentd --check`` keep answering; and everything recovers when the disk or the lock
comes back."""

import contextlib
import os
import signal
import subprocess
import threading

import pytest

from hostagent.daemon import checkpoint
from hostagent.errors import HostagentError, UnavailableError
from tests.programs import script
from tests.readwatch import ReadWatch
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import make_root, running_agent

pytestmark = [pytest.mark.root("a small tmpfs is mounted as the daemon's state folder")]


def check(agent) -> subprocess.CompletedProcess:
    return subprocess.run([script("hostagentd"), "--simulate", str(agent.root), "--config", str(agent.config),
                           "--check"], capture_output=True, text=True, timeout=30)


def fill(folder) -> None:
    """Fill the file system of ``folder`` to the last byte."""
    for name, chunk in (("filler", 4096), ("filler-tail", 1)):
        with open(folder / name, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass


@contextlib.contextmanager
def full_state_folder():
    """A simulated node whose state folder is a small tmpfs: (its root, the folder)."""
    root = make_root()
    state = root / "var/lib/hostagent"
    state.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(state)], check=True)
    try:
        yield root, state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=True)


def commit_until_refused(c) -> tuple[list[str], UnavailableError]:
    """On a full state folder, allocations until one is refused (the journal's last page may
    take a few lines more): (those made, the refusal)."""
    made = []
    for n in range(64):
        try:
            c.allocate(f"during-{n}", ["2"], sharing={"strategy": "TimeSlicing"})
        except UnavailableError as e:
            return made, e
        made.append(f"during-{n}")
    raise AssertionError("no commit was refused on a full disk")


def reads_answer(c) -> None:
    c.node()
    c.devices()
    c.allocations()
    assert c.live()["live"] is True


def test_a_full_state_folder_refuses_allocations_cleanly_and_recovers():
    with full_state_folder() as (root, state):
        with running_agent(root) as agent:
            with agent.client() as c:
                c.allocate("before", ["0"])                  # the snapshot
                c.allocate("journaled", ["1"])               # a journal line
                fill(state)
                made, refused = commit_until_refused(c)      # then every commit is refused
                assert "No space left on device" in refused.message and "nothing was changed" in refused.message
                for attempt in range(3):                     # then snapshots, each refused
                    with pytest.raises(UnavailableError):
                        c.allocate(f"refused-{attempt}", ["3"])
                    reads_answer(c)
                with pytest.raises(UnavailableError):
                    c.release("before")                     # a release commits too: refused, kept
                kept = sorted(["before", "journaled", *made])
                assert sorted(a["id"] for a in c.allocations()) == kept
                assert sorted(a.id for a in checkpoint.read(agent.host)) == kept      # whole: no half line
                assert not list(state.glob(".*.tmp")) and not list((root / "var/run/cdi").glob("*refused*"))
                assert check(agent).returncode == 0
                (state / "filler").unlink()
                (state / "filler-tail").unlink()
                c.allocate("after", ["4"])
                c.release("before")
            agent.stop()
            agent.start()
            with agent.client() as c:
                assert sorted(a["id"] for a in c.allocations()) == sorted(["after", "journaled", *made])
                assert c.node()["checkpoint"]["state"] == "ok"


def test_a_stuck_disk_or_a_held_node_lock_holds_up_allocations_not_reads():
    """Another process holds the node lock: an allocation waits for it (on the worker, not
    the event loop), while reads, GET /v1/live and hostagentd --check answer; the lock
    freed, the allocation goes through. Then a commit stuck in its write (a disk that never
    answers): the same."""
    with running_agent(make_root()) as agent:
        with agent.client() as c:
            c.allocate("warm", ["0"])                       # the next commits append a journal line
        r, w = os.pipe()
        holder = os.fork()
        if holder == 0:                                     # another writer of the node
            from hostagent.lock import node_lock
            os.close(r)
            try:
                with node_lock(agent.host, "a test holding the node"):
                    os.write(w, b"held")
                    signal.pause()
            finally:
                os._exit(0)
        os.close(w)
        assert os.read(r, 4) == b"held"
        os.close(r)
        done = threading.Event()
        errors = []

        def allocate():
            try:
                with agent.client(timeout=120) as c:
                    c.allocate("waiting", ["1"])
            except HostagentError as e:
                errors.append(e)
            done.set()
        try:
            watch = ReadWatch(agent.host.run_dir)          # the lock file's opens: the agent trying it
            threading.Thread(target=allocate).start()
            until(lambda: str(agent.host.run_dir / "node.lock") in watch.reads(),
                  what="the allocation trying the node lock")
            watch.close()
            with agent.client(timeout=5) as c:
                reads_answer(c)
            assert check(agent).returncode == 0 and not done.is_set()
        finally:
            os.kill(holder, signal.SIGTERM)
            os.waitpid(holder, 0)
        assert done.wait(60) and not errors, errors
        with agent.client() as c:
            assert {a["id"] for a in c.allocations()} == {"warm", "waiting"}


def test_a_commit_stuck_in_its_write_holds_up_allocations_not_reads():
    with running_agent(make_root()) as agent:
        with agent.client() as c:
            c.allocate("warm", ["0"])
        agent.stop()
        agent.env = {"HOSTAGENT_FAULT": "write:allocations.json=hang"}   # the disk never answers
        agent.start()
        stuck = threading.Thread(target=lambda: _quietly(agent, "stuck", "1"), daemon=True)
        stuck.start()
        until(lambda: list((agent.root / "var/lib/hostagent").glob(".allocations.json.*.tmp")),
              what="the commit's write under way")
        with agent.client(timeout=5) as c:
            reads_answer(c)
            assert [a["id"] for a in c.allocations()] == ["warm"]
        assert check(agent).returncode == 0                 # within daemon.work_timeout, work is not stuck
        agent.kill()


def _quietly(agent, alloc_id, device) -> None:
    try:
        with agent.client(timeout=60) as c:
            c.allocate(alloc_id, [device])
    except HostagentError:
        pass


MODES = {"version": "v1", "mig-configs": {"modes": [{"devices": [0], "mig-enabled": True, "mig-devices": {}},
                                                   {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]}}
MPS = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}


@GPU_CHANGES
def test_a_release_refused_on_a_full_disk_leaves_the_allocation_whole():
    """A release whose commit the disk refuses: the allocation stays, with its own MPS
    daemon serving and the MIG device made for it still there (they go only once the
    release is committed); with space back, the release goes through and takes them."""
    from hostagent.processes import ProcessRecord, current
    with full_state_folder() as (root, state):
        with running_agent(root) as agent:
            with agent.client(timeout=None) as c:
                c.mig_apply("modes", spec=MODES)
                own = c.allocate("claim-mps", [{"device": "6", "sharing": MPS}], own_mps_daemon=True)
                made = c.allocate("claim-mig", [{"mig": {"gpu": "0", "profile": "2g.10gb", "start": 0}}])
                daemon = ProcessRecord.from_dict(own["mps"]["process"])
                [mig] = made["devices"]
                fill(state)
                commit_until_refused(c)
                for alloc_id in ("claim-mps", "claim-mig"):
                    with pytest.raises(UnavailableError) as e:
                        c.release(alloc_id)
                    assert "No space left on device" in e.value.message
                assert {"claim-mps", "claim-mig"} <= {a["id"] for a in c.allocations()}
                assert {"claim-mps", "claim-mig"} <= {a.id for a in checkpoint.read(agent.host)}
                assert current(daemon) and c.allocation("claim-mps")["mps"]["process"] == own["mps"]["process"]
                assert c.device(mig)["made_for"] == "claim-mig"
                assert not (state / "allocation-releasing.json").exists()
                (state / "filler").unlink()
                (state / "filler-tail").unlink()
                c.release("claim-mps")
                c.release("claim-mig")
                assert not current(daemon)
                assert mig not in {m["uuid"] for m in c.devices(type="mig")["mig_devices"]}
                assert not (state / "allocation-releasing.json").exists()
