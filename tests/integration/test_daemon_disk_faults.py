"""What a disk and a lock do to the daemon: its state folder full (a small tmpfs, ENOSPC),
the disk stuck under a commit, the node lock held by another process. Allocations are
refused cleanly or wait; no record is half-written; reads, the liveness probe and
``hostagentd --check`` keep answering; and everything recovers when the disk or the lock
comes back."""

import os
import signal
import subprocess
import threading

import pytest

from hostagent.daemon import checkpoint
from hostagent.errors import HostagentError, UnavailableError
from tests.programs import script
from tests.readwatch import ReadWatch
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


def reads_answer(c) -> None:
    c.node()
    c.devices()
    c.allocations()
    assert c.live()["live"] is True


def test_a_full_state_folder_refuses_allocations_cleanly_and_recovers():
    root = make_root()
    state = root / "var/lib/hostagent"
    state.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(state)], check=True)
    try:
        with running_agent(root) as agent:
            with agent.client() as c:
                c.allocate("before", ["0"])                  # the snapshot
                c.allocate("journaled", ["1"])               # a journal line
                fill(state)
                # The journal's last page may take a few lines more; then every commit is refused.
                made = []
                for n in range(64):
                    try:
                        c.allocate(f"during-{n}", ["2"], sharing={"strategy": "TimeSlicing"})
                    except UnavailableError as e:
                        refused = e
                        break
                    made.append(f"during-{n}")
                else:
                    raise AssertionError("no commit was refused on a full disk")
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
    finally:
        subprocess.run(["umount", "-l", str(state)], check=True)


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
