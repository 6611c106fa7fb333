"""Pid files other processes write (a driver daemon's, which may run as its own user): the
agent reads them without blocking and signals a pid from one only once the process is seen
to run the daemon's program."""

import os
import subprocess
import threading

import pytest

from hostagent.driver.install import _terminate
from hostagent.driver.plan import Service
from hostagent.driver.probe import PERSISTENCED_PID, probe
from hostagent.errors import StateError


@pytest.fixture
def victim():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_file_naming_another_process_stops_nothing(make_node, victim):
    host, _ = make_node("dgx-a100")
    service = Service("nvidia-persistenced", pid=victim.pid, start=("nvidia-persistenced", "--persistence-mode"))
    with pytest.raises(StateError) as e:
        _terminate(host, service, timeout=1)
    assert "does not run nvidia-persistenced: not stopped" in e.value.message
    assert victim.poll() is None


def test_the_daemon_a_pid_file_names_is_stopped(make_node, persistenced):
    host, store = make_node("dgx-a100")
    persistenced(store)
    pid = probe(host).persistenced
    assert pid is not None
    _terminate(host, Service("nvidia-persistenced", pid=pid, start=("nvidia-persistenced",)), timeout=5)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_pid_file_that_is_a_fifo_or_a_link_reads_as_no_daemon(make_node, kind, victim):
    host, _ = make_node("dgx-a100")
    path = host.host(PERSISTENCED_PID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        other = path.with_name("elsewhere")
        other.write_text(f"{victim.pid}\n")
        path.symlink_to(other)
    done = []
    reader = threading.Thread(target=lambda: done.append(probe(host).persistenced), daemon=True)
    reader.start()
    reader.join(20)
    assert done == [None]
