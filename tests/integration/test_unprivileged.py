"""A simulated node read by a user without privileges: NVML (nvml.h) keeps the MIG listings,
placements and a MIG-enabled GPU's aggregates from callers lacking root and the mig/monitor
capability, and events of single MIG instances too. hostagent must still list every GPU and
MIG device, say what it could not read, and produce the same CDI spec.

The tests run as root and fork children that drop to ``nobody`` (a fork, not an exec:
nobody may not be able to read this interpreter), so the node lives in a directory anyone
may enter.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pynvml as N
import pytest

from hostagent import config
from hostagent.cli.main import main as cli_main
from hostagent.sharing import config as sharing_config
from hostagent.devices import read_inventory
from hostagent.sim import control, fakenvml
from hostagent.sim.driverroot import create_node
from hostagent.sim.files import create_cap_nodes
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.platform import simulated_host
from hostagent.sim.tools import nvidia_smi
from tests.integration.nonroot import import_everything
from tests.waiting import until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start processes as another user")

# The children are forks of this process, as nobody: whatever they import or read later
# must be in memory first, since nobody may not read this checkout, its venv or the
# standard library (a private folder, /root). Every module of hostagent and the standard
# modules it imports late are imported here (as nonroot.py does for its children).
import_everything()
for _module in ("queue", "threading", "logging"):
    __import__(_module)
config.schema()                   # and the schemas the commands validate with, read once
sharing_config._schema()

NOBODY = 65534
MONITOR = "dev/nvidia-caps/nvidia-cap2"


@pytest.fixture(scope="module")
def node():
    """dgx-a100 with MIG on GPUs 0 and 1: a 3g.20gb split into three 1c CIs, a 2g.10gb and
    a 1g.5gb each; GPU 1 numbers its instances its own way."""
    root = tempfile.mkdtemp(prefix="hostagent-unprivileged-")
    os.chmod(root, 0o755)
    store = create_node(root, "dgx-a100")
    with store.mutate() as s:
        for gpu in (0, 1):
            s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
            three = s.create_gi(store.facts, gpu, 9, (4, 4))
            for _ in range(3):
                s.create_ci(store.facts, gpu, three.id, 0)
            for profile, placement, ci_profile in ((14, (0, 2), 1), (19, (2, 1), 0)):
                gi = s.create_gi(store.facts, gpu, profile, placement)
                s.create_ci(store.facts, gpu, gi.id, ci_profile)
    create_cap_nodes(store.root, store.facts)
    yield store
    fakenvml.uninstall()
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def monitor_mode(store, mode: int):
    """The mig/monitor capability node's mode: 0o444 as the driver makes it (anyone may
    monitor), 0o400 as an admin may set it (or absent, as in a container without it)."""
    path = store.root / MONITOR
    before = os.stat(path).st_mode & 0o777
    os.chmod(path, mode)
    try:
        yield
    finally:
        os.chmod(path, before)


def become_nobody(out, err) -> None:
    """In a forked child: stdout and stderr to these files, then nobody's uid and gid."""
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def as_nobody(fn, *args, timeout: float = 60.0):
    """(exit code, stdout, stderr) of ``fn(*args)`` run in a forked child as nobody; its
    return value is printed as JSON on the child's stdout unless None."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            become_nobody(out, err)
            result = fn(*args)
            if result is not None and not isinstance(result, int):
                print(json.dumps(result))
                result = 0
            code = result or 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the child did not finish")
        time.sleep(0.01)
    out.seek(0)
    err.seek(0)
    return os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode()


def cli(store, *argv):
    return as_nobody(cli_main, ["--simulate", str(store.root), *argv])


def cli_as_root(store, *argv) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli_main(["--simulate", str(store.root), *argv]) == 0
    return buf.getvalue()


def nvml_answers(root):
    """What NVML answers this process on GPUs 0 (MIG enabled) and 2 (MIG disabled)."""
    fakenvml.install(root)
    N.nvmlInit()

    def code(fn, *args):
        try:
            fn(*args)
            return "ok"
        except N.NVMLError as e:
            return e.value

    h, plain = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(2)
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    gis = (N.c_nvmlGpuInstance_t * 7)()
    count = N.c_uint(0)
    return {
        "memory": code(N.nvmlDeviceGetMemoryInfo, h),
        "processes": code(N.nvmlDeviceGetComputeRunningProcesses, h),
        "gpu_instances": code(N.nvmlDeviceGetGpuInstances, h, 9, gis, N.byref(count)),
        "gpu_instance_by_id": code(N.nvmlDeviceGetGpuInstanceById, h, 1),
        "placements": code(N.nvmlDeviceGetGpuInstancePossiblePlacements, h, 9, None, N.byref(count)),
        "remaining": code(N.nvmlDeviceGetGpuInstanceRemainingCapacity, h, 19),
        "profile_info": code(N.nvmlDeviceGetGpuInstanceProfileInfo, h, 0),
        "mig_device": code(N.nvmlDeviceGetUUID, mig),
        "mig_device_memory": code(N.nvmlDeviceGetMemoryInfo, mig),
        "mig_device_attributes": code(N.nvmlDeviceGetAttributes_v2, mig),
        "gpu_attributes": code(N.nvmlDeviceGetAttributes_v2, h),
        "create": code(N.nvmlDeviceCreateGpuInstance, h, 19),
        "set_mig_mode": code(N.nvmlDeviceSetMigMode, plain, N.NVML_DEVICE_MIG_ENABLE),
        "memory_without_mig": code(N.nvmlDeviceGetMemoryInfo, plain),
    }


NO = N.NVML_ERROR_NO_PERMISSION


def test_nvml_refuses_what_nvml_h_reserves_to_privileged_users(node):
    with monitor_mode(node, 0o400):
        rc, out, err = as_nobody(nvml_answers, node.root)
    assert rc == 0, err
    assert json.loads(out) == {
        "memory": NO, "processes": NO, "gpu_instances": NO, "gpu_instance_by_id": NO,
        "placements": NO, "remaining": NO, "create": NO, "set_mig_mode": NO,
        "profile_info": "ok", "mig_device": "ok", "mig_device_memory": "ok",
        "mig_device_attributes": "ok", "memory_without_mig": "ok",
        "gpu_attributes": N.NVML_ERROR_NOT_SUPPORTED}     # nvml.h: MIG device handles only


def test_the_monitor_capability_grants_the_listings_but_not_changes(node):
    # The driver's own mode for mig/monitor is 0444: on a bare host anyone may monitor (an
    # A30 user ran nvidia-smi mig -lgipp and saw a MIG parent's memory without sudo).
    rc, out, err = as_nobody(nvml_answers, node.root)
    assert rc == 0, err
    got = json.loads(out)
    assert {k: got[k] for k in ("memory", "processes", "gpu_instances", "placements", "remaining")} == \
        dict.fromkeys(("memory", "processes", "gpu_instances", "placements", "remaining"), "ok")
    assert (got["create"], got["set_mig_mode"]) == (NO, NO)      # mig/config is 0400, and CAP_SYS_ADMIN


def test_devices_lists_every_gpu_and_mig_device_and_says_what_it_could_not_read(node):
    root_view = json.loads(cli_as_root(node, "devices", "-o", "json"))
    with monitor_mode(node, 0o400):
        rc, out, err = cli(node, "devices", "-o", "json")
        table = cli(node, "devices")
    assert rc == 0, err
    mine = json.loads(out)
    assert [g["uuid"] for g in mine["gpus"]] == [g["uuid"] for g in root_view["gpus"]] and not mine["unreadable"]
    key = ("uuid", "index", "gi", "ci", "profile", "memory_mib", "multiprocessors", "engines")
    for gpu, theirs in zip(mine["gpus"], root_view["gpus"]):
        assert gpu["minor"] == theirs["minor"]
        if gpu["mig"] and gpu["mig"]["mode"]["current"] == "enabled":
            assert gpu["memory_mib"] is None and gpu["mig"]["gpu_instances"] == []
            assert gpu["mig"]["devices"] == theirs["mig"]["devices"]
        else:
            assert gpu["memory_mib"] == theirs["memory_mib"]
    assert [{k: d[k] for k in key} for d in mine["mig_devices"]] == \
        [{k: d[k] for k in key} for d in root_view["mig_devices"]]
    assert all(d["placement"] is None for d in mine["mig_devices"])
    assert {(u["gpu"], u["what"]) for u in mine["unread"]} >= {
        (0, "memory"), (0, "gpu instances"), (1, "memory"), (1, "gpu instances"), (2, "placements")}
    assert len(mine["mig_devices"]) == 10
    rc, text, _ = table
    assert rc == 0 and "GPU 0: NVML refused this user its memory, placements, gpu instances" in text
    assert "mig/monitor capability" in text and "1:4 " in text


def test_labels_and_cdi_spec_are_whole_without_privilege(node):
    spec_as_root = cli_as_root(node, "cdi", "generate")
    labels_as_root = cli_as_root(node, "labels", "--mig-strategy", "mixed", "--no-timestamp")
    with monitor_mode(node, 0o400):
        rc, spec, err = cli(node, "cdi", "generate")
        assert rc == 0, err
        assert spec == spec_as_root                  # every GPU and MIG device, same edits
        assert "hostagent: note: GPU 0: NVML refused" in err
        rc, labels, err = cli(node, "labels", "--mig-strategy", "mixed", "--no-timestamp")
    assert rc == 0, err
    assert "mig/monitor capability" in err
    mig_labels = lambda text: sorted(line for line in text.splitlines() if line.startswith("nvidia.com/mig"))
    assert mig_labels(labels) == mig_labels(labels_as_root) != []


def test_health_watch_without_privilege_sees_only_whole_gpu_events_and_says_so(node):
    mig_dev = read_inventory(simulated_host(node.root)).gpus[0].mig.devices[1]
    with monitor_mode(node, 0o400):
        out, err = tempfile.NamedTemporaryFile(), tempfile.NamedTemporaryFile()
        pid = os.fork()
        if pid == 0:
            try:
                become_nobody(out, err)
                cli_main(["--simulate", str(node.root), "health", "watch", "-o", "json", "--no-state-file"])
            finally:
                os._exit(0)
        try:
            until(lambda: b'"initial"' in open(out.name, "rb").read(), 20, lambda: open(err.name).read())
            control.inject_xid(node, 0, 94, gi=mig_dev.gi, ci=mig_dev.ci)     # one MIG device's
            control.inject_xid(node, 0, 48)                                     # the whole GPU's
            until(lambda: b'"xid": 48' in open(out.name, "rb").read(), 20, lambda: open(err.name).read())
        finally:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        text, warning = open(out.name).read(), open(err.name).read()
    assert "GPU 0, 1: NVML gives this user only the events of whole MIG-enabled GPUs" in warning
    assert '"xid": 48' in text and '"xid": 94' not in text


def smi(root, *argv):
    return nvidia_smi.main(str(root), list(argv))


def test_nvidia_smi_as_an_unprivileged_user(node):
    with monitor_mode(node, 0o400):
        rc, out, _ = as_nobody(smi, node.root, "mig", "-lgi")
        assert (rc, out.strip()) == (4, "Failed to display GPU instances: Insufficient Permissions")
        rc, out, _ = as_nobody(smi, node.root, "-L")
        assert rc == 0 and out.count("  MIG ") == 10 and "Device  4:" in out
        rc, out, _ = as_nobody(smi, node.root, "--query-gpu=index,memory.total", "--format=csv,noheader")
        assert out.splitlines()[:3] == ["0, [Insufficient Permissions]", "1, [Insufficient Permissions]",
                                        "2, 40960 MiB"]
        rc, out, _ = as_nobody(smi, node.root, "-i", "0")
        assert rc == 0 and "N/A |" in out and "MIG devices:" in out
    rc, out, _ = as_nobody(smi, node.root, "mig", "-lgi")            # mig/monitor readable
    assert rc == 0 and out.count("MIG 1g.5gb") == 2
    rc, out, _ = as_nobody(smi, node.root, "mig", "-cgi", "19", "-i", "0")
    assert rc == 4 and "Insufficient Permissions" in out
    rc, out, _ = as_nobody(smi, node.root, "-i", "2", "-mig", "1")
    assert rc == 4 and "Unable to enable MIG Mode for GPU 00000000:47:00.0: Insufficient Permissions" in out
    assert node.read().gpus[2].mig_current != MIG_ENABLE


def _bind(path, group):
    """``serve``'s socket, as its daemon makes it: the error's message, if any."""
    from hostagent.daemon.listen import bind_socket
    from hostagent.errors import StateError
    try:
        bind_socket(path, group, 0o660)[0].close()
    except StateError as e:
        print(e.message)
        return 1
    return 0


def test_on_a_node_of_its_own_a_user_is_told_what_needs_root():
    """A user's own simulated node: a dry run says the apply needs root; the apply, refused
    by NVML, says to run it as root and records nothing; the daemon's socket names the group
    it may not be given to, not the socket's path."""
    from .nonroot import import_everything
    import_everything()          # nobody may not read this interpreter's standard library
    root = Path(tempfile.mkdtemp(prefix="hostagent-own-"))
    try:
        store = create_node(root, "a30x4")
        (root / "sharing.yaml").write_text("sharing: {mps: {resources: [{name: gpu, devices: [0], replicas: 2}]}}\n")
        for folder, _, names in os.walk(root):
            for path in (folder, *(os.path.join(folder, n) for n in names)):
                if not os.path.islink(path) and not stat.S_ISCHR(os.lstat(path).st_mode):
                    os.chown(path, NOBODY, NOBODY)
        for command in (["mig", "apply", "-c", "all-1g.6gb"], ["sharing", "apply", "-f", str(root / "sharing.yaml")]):
            again = f"sudo hostagent --simulate {root} {' '.join(command)}"
            code, _, err = cli(store, *command, "--dry-run")
            assert code == 0 and f"hostagent: note: the apply itself needs root: {again}\n" in err, err
            code, out, err = cli(store, *command)
            assert code == 1 and "Insufficient Permissions" in out + err and f"run it as root: {again}" in err, out + err
        assert not (root / "etc/hostagent/sharing.yaml").exists()
        assert not (root / "var/lib/hostagent/sharing/journal.json").exists()
        code, out, err = as_nobody(_bind, root / "run/hostagent/hostagent.sock", "root")
        assert code == 1 and out.startswith(f"{root}/run/hostagent/hostagent.sock: cannot give the API socket to "
                                            "group 'root': Operation not permitted"), out + err
        assert f"uid {NOBODY} is not in group 'root': run the daemon as root, or set api.group" in out
    finally:
        shutil.rmtree(root, ignore_errors=True)
