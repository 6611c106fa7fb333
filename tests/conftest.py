import os
import signal
from pathlib import Path

import pynvml
import pytest

from hostagent.hostroot import HostRoot
from hostagent.sim.driverroot import create_node
from hostagent.sim.platform import simulated_host

from . import host_state

_HOST_BEFORE = pytest.StashKey[dict]()
_HOST_CHANGES = pytest.StashKey[list]()


@pytest.fixture
def make_node(tmp_path_factory):
    """Build a simulated node; returns (HostRoot, SimStore)."""
    def make(profile: str = "dgx-a100", **options):
        root = tmp_path_factory.mktemp(profile)
        store = create_node(root, profile, **options)
        return simulated_host(root), store
    return make


@pytest.fixture
def persistenced():
    """Start a simulated node's nvidia-persistenced stand-in: a driver client that keeps
    Ampere GPUs from resetting themselves, so their MIG mode changes wait for a reset."""
    from hostagent.sim import control
    pids = []

    def start(store):
        pids.append(control.start_persistenced(store))

    yield start
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


@pytest.fixture(autouse=True)
def _simulated_nvml_is_complete(request):
    """Every NVML function hostagent calls must exist in the simulator and never crash it."""
    yield
    lib = pynvml.nvmlLib
    if lib is None or not hasattr(lib, "crashes"):
        return
    missing, crashes = list(lib.missing), list(lib.crashes)
    lib.missing.clear()
    lib.crashes.clear()
    if "allow_missing_nvml" not in request.keywords:
        assert not missing, f"simulated NVML lacks functions: {missing}"
    assert not crashes, "simulated NVML crashed:\n" + "\n".join(crashes)


@pytest.fixture
def private_run_dir(monkeypatch, tmp_path_factory):
    """For commands given real paths (no --simulate), which take the node lock in the
    host's /run/hostagent: in this process, the real root's run folder is a temporary one."""
    run = tmp_path_factory.mktemp("run")
    real = HostRoot.run_dir.fget
    monkeypatch.setattr(HostRoot, "run_dir",
                        property(lambda host: run if host.root == Path("/") else real(host)))
    return run


def pytest_sessionstart(session):
    session.stash[_HOST_BEFORE] = host_state.listing()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if it changed the host's own hostagent folders (what was there before may stay)."""
    found = host_state.changes(session.stash[_HOST_BEFORE], host_state.listing())
    session.config.stash[_HOST_CHANGES] = found
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    found = config.stash.get(_HOST_CHANGES, [])
    if found:
        terminalreporter.write_sep("=", "the tests changed the host's hostagent folders", red=True)
        for line in found:
            terminalreporter.write_line(line)


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_missing_nvml: the test calls NVML functions the simulator lacks on purpose")
    os.environ.pop("HOSTAGENT_SIMULATE", None)
