"""A simulated node made by a normal user, whose device nodes are regular files (only root
may create device nodes): its CDI spec and its allocations are root's, the device numbers
read from the simulator's records of them.

The tests run as root and fork children that drop to ``nobody`` (a fork, not an exec:
nobody may not be able to read this interpreter)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from hostagent.client import Client, DaemonNotRunning
from hostagent.errors import UnavailableError
from hostagent.sim.driverroot import create_node
from tests.runfolder import others_can_read
from tests.waiting import until

from .agentd import ABSENT_GROUP
from . import nonroot
from .nonroot import NOBODY, import_everything

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start processes as another user"),
    pytest.mark.skipif(not others_can_read(__file__),
                       reason="nobody may not read this checkout or its venv (a private folder): the forked "
                              "children import from them; clone into a folder others may read to run these")]


@pytest.fixture
def folder():
    """A folder nobody owns, removed afterwards."""
    import_everything()          # nobody may not read this interpreter's standard library
    path = Path(tempfile.mkdtemp(prefix="hostagent-users-node-"))
    path.chmod(0o755)
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_as_nobody(argv: list[str]) -> tuple[int, str]:
    """``nonroot.run_as_nobody`` with the child's sys.stdout and sys.stderr on its own file
    descriptors (pytest captures them otherwise)."""
    import sys
    saved = sys.stdout, sys.stderr
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    try:
        return nonroot.run_as_nobody(argv)
    finally:
        sys.stdout, sys.stderr = saved


def nobody(*argv) -> str:
    code, out = run_as_nobody([str(a) for a in argv])
    assert code == 0, out
    return out


def gpu_devices(spec_path: Path, root: Path) -> dict[str, list]:
    """The spec's whole-GPU devices by name: their device nodes, with the node's folder left
    out of host paths."""
    spec = json.loads(spec_path.read_text())
    return {d["name"]: [{k: str(v).replace(str(root), "ROOT") for k, v in n.items()}
                        for n in d["containerEdits"].get("deviceNodes", [])]
            for d in spec["devices"] if d["name"].isdigit()}


def test_a_users_own_dgx_a100_has_roots_cdi_spec(folder, tmp_path):
    node = folder / "node"
    assert "device nodes: regular files" in nobody("sim", "create", "--profile", "dgx-a100", "--root", node)
    assert stat.S_ISREG(os.lstat(node / "dev/nvidia0").st_mode)
    out = nobody("--simulate", node, "cdi", "refresh")
    assert "nvidia.com-gpu.json: created with 17 devices" in out and "error" not in out, out
    theirs = gpu_devices(node / "var/run/cdi/nvidia.com-gpu.json", node)
    assert sorted(theirs) == [str(i) for i in range(8)]
    # Root's node of the same profile (real device nodes) describes the same devices.
    mine = tmp_path / "root-node"
    create_node(mine, "dgx-a100", dynamic_majors=_majors(node))
    from hostagent.cli.main import main
    assert main(["--simulate", str(mine), "cdi", "refresh"]) == 0
    assert stat.S_ISCHR(os.lstat(mine / "dev/nvidia0").st_mode)
    assert gpu_devices(mine / "var/run/cdi/nvidia.com-gpu.json", mine) == theirs
    assert theirs["3"][0]["major"] == "195" and theirs["3"][0]["type"] == "c"


def _majors(root: Path) -> tuple[int, int]:
    facts = json.loads((root / ".sim/node.json").read_text())["majors"]
    return facts["nvidia-uvm"], facts["nvidia-caps"]


def test_a_users_own_daemon_allocates_a_gpu(folder):
    node = folder / "node"
    nobody("sim", "create", "--profile", "dgx-a100", "--root", node)
    config = node / "etc/hostagent/config.yaml"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps({"api": {"group": ABSENT_GROUP}, "metrics": {"port": None},
                                  "daemon": {"resync_interval": 0}}))
    os.chown(config, NOBODY, NOBODY)
    socket = node / "run/hostagent/hostagent.sock"
    pid = os.fork()
    if pid == 0:                               # the daemon, as nobody
        code = 70
        try:
            log = os.open(folder / "daemon.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            import sys
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            from hostagent.daemon.main import main
            code = main(["--simulate", str(node)])
        finally:
            os._exit(code)
    try:
        def ready():
            try:
                with Client(socket_path=socket, timeout=2) as c:
                    return c.node()
            except (DaemonNotRunning, UnavailableError, FileNotFoundError):
                return None
        until(ready, timeout=30, what=lambda: (folder / "daemon.log").read_text())
        code, out = run_as_nobody(["--simulate", str(node), "allocations", "list"])
        assert code == 0, out
        allocated = _allocate_as_nobody(socket)
        assert allocated["code"] == 0, allocated
        assert len(allocated["devices"]) == 1 and allocated["cdi_devices"][0].startswith("hostagent.io/allocation=")
    finally:
        os.kill(pid, signal.SIGTERM)
        until(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, timeout=30, what="the user's daemon stopping")


def _allocate_as_nobody(socket: Path) -> dict:
    """A one-GPU allocation asked of the daemon by nobody, in a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        answer = {"code": 70}
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with Client(socket_path=socket, timeout=10) as c:
                alloc = c.allocate("users-own", [{"constraints": {"type": "gpu"}, "count": 1}])
            answer = {"code": 0, "devices": alloc["devices"], "cdi_devices": alloc["cdi_devices"]}
        except BaseException as e:
            answer = {"code": 1, "error": repr(e)}
        finally:
            os.write(w, json.dumps(answer).encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text)
