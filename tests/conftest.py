import os
import signal
from pathlib import Path

import pynvml
import pytest

from hostagent.hostroot import HostRoot
from hostagent.sim.driverroot import create_node
from hostagent.sim.platform import simulated_host

from . import host_state, runfolder

_HOST_BEFORE = pytest.StashKey[dict]()
_HOST_CHANGES = pytest.StashKey[list]()
_RUN_FOLDER = pytest.StashKey[Path]()
_LEFT_BEHIND = pytest.StashKey[list]()


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


def _worker(config) -> str | None:
    """The worker's name (``gw0``) in a parallel run's worker, None in its controller or in a
    serial run."""
    return getattr(config, "workerinput", {}).get("workerid")


def pytest_sessionstart(session):
    if _worker(session.config) is None:     # a parallel run's controller brackets its workers
        session.stash[_HOST_BEFORE] = host_state.listing()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if it changed the host's own hostagent folders (what was there before may
    stay), or left a process or a mount behind (stopped and removed here all the same)."""
    if _worker(session.config) is not None:
        return              # the controller checks the host and the folder once its workers are done
    found = host_state.changes(session.stash[_HOST_BEFORE], host_state.listing())
    session.config.stash[_HOST_CHANGES] = found
    folder = session.config.stash.get(_RUN_FOLDER, None)
    left = runfolder.sweep(folder, remove=False) if folder is not None else []
    session.config.stash[_LEFT_BEHIND] = left
    if (found or left) and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    for key, title in ((_HOST_CHANGES, "the tests changed the host's hostagent folders"),
                       (_LEFT_BEHIND, "the tests left these running or mounted (now stopped)")):
        found = config.stash.get(key, [])
        if found:
            terminalreporter.write_sep("=", title, red=True)
            for line in found:
                terminalreporter.write_line(line)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Before pytest's own temporary folders are set up: the run's folder (``runfolder``), which
    holds them too unless --basetemp says otherwise. SIGTERM interrupts the run as Ctrl-C
    does, so what was started is stopped and removed then too."""
    config.addinivalue_line("markers", "allow_missing_nvml: the test calls NVML functions the simulator lacks on purpose")
    os.environ.pop("HOSTAGENT_SIMULATE", None)
    worker = _worker(config)
    if worker is not None:
        # A parallel run's worker: the controller's folder, pytest's folders in its p<n>.
        folder = runfolder.join(worker)
        config.option.basetemp = str(folder / f"p{worker.removeprefix('gw')}")
    else:
        folder = runfolder.begin()
        config.stash[_RUN_FOLDER] = folder
        if config.option.basetemp is None:
            config.option.basetemp = str(folder / "p")
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """A parallel run's scheduling: each module's tests on one worker, in order (its module
    fixtures made once), and every test that starts a real container engine (tests/e2e) on
    one worker, one at a time: they share /etc/cdi, image tags and the engines."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/e2e" if path.startswith("tests/e2e/") else path

    return ByModule(config, log)


def pytest_unconfigure(config):
    folder = config.stash.get(_RUN_FOLDER, None)
    if folder is not None:
        runfolder.sweep(folder, remove=True)


def pytest_runtest_setup(item):
    """``@pytest.mark.root(reason)``: skipped, saying why, unless the run is root's."""
    mark = item.get_closest_marker("root")
    if mark is not None and os.geteuid() != 0:
        pytest.skip(mark.args[0] if mark.args else mark.kwargs.get("reason", "needs root (CI runs the suite as root)"))
