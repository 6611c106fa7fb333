"""MIG through the daemon: layouts, on-demand instances, protection of allocated devices,
the CLI going through the daemon, and kill -9 in the middle of an apply."""

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from hostagent.errors import ConflictError, HostagentError, NotFoundError, UsageError
from hostagent.sim import control
from hostagent.sim.store import SimStore
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import AgentProcess, make_root, running_agent

pytestmark = GPU_CHANGES

SPEC = {"version": "v1", "mig-configs": {
    "two": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.20gb": 1, "1g.5gb": 2}},
            {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": False}],
    "none": [{"devices": "all", "mig-enabled": False}]}}


def post(c, path, body):
    return c.request("POST", path, body).json()


@contextlib.contextmanager
def driver_client(root):
    """The node's nvidia-persistenced stand-in running: a driver client holding the A100s,
    so their MIG mode changes wait for the GPU reset these tests watch."""
    pid = control.start_persistenced(SimStore(root))
    try:
        yield
    finally:
        os.kill(pid, signal.SIGTERM)


@pytest.fixture(scope="module")
def module_agent():
    root = make_root()
    with driver_client(root):
        with running_agent(root) as proc:
            yield proc


@pytest.fixture
def agent(module_agent):
    """The module's daemon with every GPU's MIG mode off, whatever ran before."""
    with module_agent.client() as c:
        post(c, "/v1/mig/apply", {"config": "none", "spec": SPEC})
    return module_agent


def test_plan_dry_run_apply_and_watch(agent):
    with agent.client() as c:
        state = c.get("/v1/mig")
        assert state["apply_in_progress"] is False
        assert state["gpus"][0]["mig"]["layout"] == "MIG disabled"
        plan = post(c, "/v1/mig/plan", {"config": "two", "spec": SPEC})["plan"]
        assert plan["changed"] == [0, 1]
        dry = post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC, "dry_run": True})
        assert dry["dry_run"] and c.devices(type="mig")["mig_devices"] == []
        stream = c.watch()
        start = next(stream)["revision"]
        done = post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC})
        assert done["changed"] == [0, 1] and done["revision"] > start
        seen = []
        while not seen or seen[-1]["revision"] < done["revision"]:
            seen.append(next(stream))
        stream.close()
        added = [e["device"]["profile"] for e in seen if e["type"] == "device_added"]
        assert sorted(added) == ["1g.5gb"] * 4 + ["3g.20gb"] * 2
        migs = c.devices(type="mig")["mig_devices"]
        assert all(m["cdi_devices"] for m in migs)
        again = post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC})
        assert again["changed"] == []
        assert "3g.20gb@" in c.get("/v1/mig")["gpus"][0]["mig"]["layout"]


def test_on_demand_create_best_fit_and_destroy(agent):
    with agent.client() as c:
        post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC})
        # GPUs 0 and 1 each have 3g@0:4 + 1g@4:1 + 1g@5:1. A 2g.10gb would need slices 6-7,
        # which no 2g placement has; a 1g.10gb fits there, on either GPU: the first wins.
        with pytest.raises(ConflictError):
            post(c, "/v1/mig/instances", {"profile": "2g.10gb"})
        dev = c.request("POST", "/v1/mig/instances", {"profile": "1g.10gb"})
        assert dev.status == 201
        dev = dev.json()
        assert dev["kind"] == "mig" and dev["profile"] == "1g.10gb" and dev["parent_index"] == 0
        assert dev["placement"] == {"start": 6, "size": 2}
        assert dev["cdi_devices"] and c.device(dev["uuid"])["name"] == dev["name"]
        chosen = post(c, "/v1/mig/instances", {"profile": "1g.5gb", "gpu": "1"})
        assert chosen["parent_index"] == 1
        with pytest.raises(ConflictError) as e:
            post(c, "/v1/mig/instances", {"profile": "7g.40gb"})
        assert e.value.code == "insufficient_resources"
        with pytest.raises(ConflictError):
            post(c, "/v1/mig/instances", {"profile": "1g.5gb", "gpu": "5"})     # MIG disabled there
        with pytest.raises(UsageError):
            post(c, "/v1/mig/instances", {"profile": "9g.99gb"})
        with pytest.raises(NotFoundError):
            post(c, "/v1/mig/instances", {"profile": "1g.5gb", "gpu": "GPU-nope"})
        # A process on it: refused with the explicit in-use error naming it.
        from hostagent.sim import control
        from hostagent.sim.store import SimStore
        proc = control.hold(SimStore(agent.root), dev["uuid"], name="trainer")
        try:
            with pytest.raises(ConflictError) as e:
                c.request("DELETE", "/v1/mig/instances/" + dev["uuid"])
            assert e.value.status == 409 and e.value.code == "in_use"
            assert e.value.details["devices"][0]["uuid"] == dev["uuid"]
            assert e.value.details["processes"] == [{"pid": proc.pid, "name": "sleep", "gpu": 0,
                                                     "gpu_instance": dev["gi"], "compute_instance": dev["ci"]}]
        finally:
            control.release(SimStore(agent.root), proc.pid)
        gone = c.request("DELETE", "/v1/mig/instances/" + dev["uuid"]).json()
        assert gone["uuid"] == dev["uuid"]
        c.request("DELETE", "/v1/mig/instances/" + chosen["uuid"])
        with pytest.raises(NotFoundError):
            c.request("DELETE", "/v1/mig/instances/" + dev["uuid"])
        assert dev["uuid"] not in {m["uuid"] for m in c.devices(type="mig")["mig_devices"]}


def test_allocated_devices_are_not_taken_away(agent):
    with agent.client() as c:
        post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC})
        assert c.mig_plan("none", SPEC)["busy"] == []
        alloc = c.allocate("mig-user", [{"constraints": {"profile": "3g.20gb"}}], labels={"pod": "a/b"})
        uuid = alloc["devices"][0]
        # The plan names what is in the way before an apply is refused for it; a plan that
        # leaves the device alone names nothing.
        assert c.mig_plan("none", SPEC)["busy"] == [{"id": "mig-user", "labels": {"pod": "a/b"}, "devices": [uuid]}]
        assert c.mig_plan("two", SPEC)["busy"] == []
        with pytest.raises(ConflictError) as e:
            c.request("DELETE", f"/v1/mig/instances/{uuid}")
        assert e.value.code == "device_busy"
        with pytest.raises(ConflictError) as e:
            post(c, "/v1/mig/apply", {"config": "none", "spec": SPEC})
        assert e.value.code == "device_busy" and e.value.details["allocations"] == ["mig-user"]
        assert uuid in {m["uuid"] for m in c.devices(type="mig")["mig_devices"]}
        c.release("mig-user")
        post(c, "/v1/mig/apply", {"config": "none", "spec": SPEC})
        assert c.devices(type="mig")["mig_devices"] == []


def test_bad_layouts(agent):
    with agent.client() as c:
        with pytest.raises(HostagentError) as e:
            post(c, "/v1/mig/apply", {"config": "two", "spec": {"version": "v9"}})
        assert e.value.code == "invalid_config"
        bad = {"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True,
                                                        "mig-devices": {"5g.99gb": 1}}]}}
        with pytest.raises(HostagentError) as e:
            post(c, "/v1/mig/plan", {"spec": bad})
        assert e.value.code == "mig_plan_error" and "5g.99gb" in str(e.value)
        with pytest.raises(UsageError):
            post(c, "/v1/mig/apply", {"config": "two", "colour": 1})


def test_oversized_inline_layouts_are_refused_and_other_requests_go_on(agent):
    # Counts that once made the placement search grow without bound, sent inline by a
    # member of the API's group: each is refused by capacity, and the daemon goes on.
    for devices in ({"1g.5gb": 22}, {"1g.5gb": 300}, {"1c.7g.40gb": 10**9},
                    {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}):
        spec = {"version": "v1", "mig-configs": {"big": [
            {"devices": "all", "mig-enabled": True, "mig-devices": devices}]}}
        with agent.client() as c:
            with pytest.raises(HostagentError) as e:
                c.request("POST", "/v1/mig/plan", {"config": "big", "spec": spec}).json()
            assert "cannot be applied" in e.value.message
            assert "GPU 0-7" in e.value.message
            assert c.get("/v1/mig")["gpus"][0]["mig"]["layout"] == "MIG disabled"


def test_inline_hooks_run_in_the_daemon_with_mig_parteds_variables(agent, tmp_path):
    """No files name the request's documents: their variables are empty, as mig-parted's
    are without the flags; the selected config is the one planned."""
    log = tmp_path / "hooks.log"
    record = (f'echo "$0 $MIG_PARTED_SELECTED_CONFIG [$MIG_PARTED_CONFIG_FILE] [$MIG_PARTED_HOOKS_FILE] '
              f'$MIG_PARTED_SKIP_RESET $MIG_PARTED_MODE_CHANGE_ONLY" >> {log}')
    hooks = {"version": "v1", "hooks": {name: [{"command": "/bin/sh", "args": ["-c", record, name]}]
                                        for name in ("apply-start", "pre-apply-mode", "apply-exit")}}
    with agent.client() as c:
        done = post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC, "hooks": hooks, "mode_only": True})
    assert done["changed"] == [0, 1]
    assert log.read_text().splitlines() == [f"{name} two [] [] false true"
                                            for name in ("apply-start", "pre-apply-mode", "apply-exit")]


def test_cli_goes_through_the_daemon(agent, tmp_path):
    spec = tmp_path / "mig.yaml"
    spec.write_text(json.dumps(SPEC))
    log, at_exit = tmp_path / "hooks.log", tmp_path / "spec-at-exit.json"
    record = (f'echo "$0 $MIG_PARTED_SELECTED_CONFIG $MIG_PARTED_CONFIG_FILE $MIG_PARTED_HOOKS_FILE '
              f'$MIG_PARTED_SKIP_RESET $MIG_PARTED_MODE_CHANGE_ONLY $(tr "\\0" " " < /proc/$PPID/cmdline)" >> {log}')
    hooks = {name: [{"command": "/bin/sh", "args": ["-c", record, name]}]
             for name in ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")}
    hooks["apply-exit"].append({"command": "/bin/cp", "args": [str(agent.root / "var/run/cdi/nvidia.com-gpu.json"),
                                                               str(at_exit)]})
    hooks_file = tmp_path / "hooks.yaml"
    hooks_file.write_text(json.dumps({"version": "v1", "hooks": hooks}))
    done = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(agent.root),
                           "mig", "apply", "-f", str(spec), "-c", "two", "-k", str(hooks_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "applying through the daemon" in done.stderr
    # The same output as a direct apply: progress per GPU and the CDI refresh on stderr ...
    assert "GPU 0: enable MIG mode" in done.stderr and "resetting GPU 0 (" in done.stderr
    assert "GPU 1: create 3 GI, create 3 CI" in done.stderr and "CDI spec: " in done.stderr
    # ... the summary on stdout.
    assert "GPU 0 (NVIDIA A100-SXM4-40GB): enable MIG (reset if left pending), create 3 GI, create 3 CI" in done.stdout
    assert "capability nodes: 12 created, 0 removed" in done.stdout
    assert "MIG configuration 'two' applied successfully: 2 GPU(s) changed, 6 unchanged" in done.stdout
    assert "MIG config 'two'" in agent.log()
    # Hooks ran in the CLI's process (their parent), at mig-parted's points, with its variables.
    lines = log.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == ["apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"]
    for ln in lines:
        assert ln.split()[1:6] == ["two", str(spec), str(hooks_file), "false", "false"]
        assert "hostagent.cli.main" in ln and " mig apply " in ln and " serve" not in ln
    with agent.client() as c:
        migs = c.devices(type="mig")["mig_devices"]
        assert len(migs) == 6
        # The spec was refreshed before apply-exit ran.
        names = {d["name"] for d in json.loads(at_exit.read_text())["devices"]}
        assert {m["uuid"] for m in migs} <= names
        post(c, "/v1/mig/apply", {"config": "none", "spec": SPEC})


def test_cli_without_hooks_goes_through_the_daemon_with_its_flags(agent, tmp_path):
    spec = tmp_path / "mig.yaml"
    spec.write_text(json.dumps(SPEC))
    cli = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(agent.root), "mig", "apply",
           "-f", str(spec)]
    done = subprocess.run(cli + ["-c", "two", "--mode-only"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "applying through the daemon" in done.stderr, done.stderr
    with agent.client() as c:
        assert [g["mig"]["mode"]["current"] == "enabled" for g in c.mig()["gpus"]][:3] == [True, True, False]
        assert c.devices(type="mig")["mig_devices"] == []          # modes only
    done = subprocess.run(cli + ["-c", "none"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "MIG configuration 'none' applied successfully: 2 GPU(s) changed" in done.stdout
    assert layouts(agent) == ["MIG disabled"] * 8


def test_cli_hooks_failing_before_the_daemon_apply_change_nothing(agent, tmp_path):
    spec = tmp_path / "mig.yaml"
    spec.write_text(json.dumps(SPEC))
    hooks_file = tmp_path / "hooks.yaml"
    hooks_file.write_text(json.dumps({"version": "v1", "hooks": {"pre-apply-config": [
        {"command": "/bin/sh", "args": ["-c", "echo cannot stop kubelet >&2; exit 4"]}]}}))
    before = layouts(agent)
    done = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(agent.root),
                           "mig", "apply", "-f", str(spec), "-c", "two", "-k", str(hooks_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == (
        "hostagent: error: pre-apply-config hook failed: /bin/sh exited with status 4: cannot stop kubelet")
    assert layouts(agent) == before


def layouts(agent) -> list:
    with agent.client() as c:
        return [g["mig"]["layout"] for g in c.get("/v1/mig")["gpus"]]


def test_kill9_during_apply_then_restart():
    """A hook kills the daemon between the mode phase and the instances of an apply; the
    restarted daemon finds the node in neither layout and rolls the journal back: the
    layout is the old one, the node spec matches it, allocations of untouched devices
    survive, and the apply made again goes through."""
    root = make_root()
    with running_agent(root) as agent:
        with agent.client() as c:
            keep = c.allocate("keeper", ["5"])
        before = layouts(agent)
        hooks = {"version": "v1", "hooks": {"pre-apply-config": [
            {"command": "/bin/sh", "args": ["-c", "kill -9 $PPID"]}]}}
        with agent.client() as c:
            with pytest.raises(HostagentError):
                post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC, "hooks": hooks})
        assert agent.proc.wait(10) == -9
        assert (root / "var/lib/hostagent/mig").exists()
        agent.start()
        after = layouts(agent)
        with agent.client() as c:
            assert c.get("/v1/mig")["apply_in_progress"] is False
            assert not (root / "var/lib/hostagent/mig/journal.json").exists()
            # Killed before the config step (its modes changed, no instance made): not the new
            # layout, so the start restores the checkpoint's, the one before the apply.
            assert after == before
            assert c.allocation("keeper")["devices"] == keep["devices"]
            spec = json.loads((root / "var/run/cdi/nvidia.com-gpu.json").read_text())
            names = {d["name"] for d in spec["devices"]}
            for dev in c.devices()["gpus"] + c.devices()["mig_devices"]:
                if dev["kind"] == "gpu" and dev["mig"]["mode"]["current"] == "enabled":
                    assert dev["name"] not in names
                else:
                    assert dev["name"] in names and dev["uuid"] in names
        assert "MIG: rolled back" in agent.log(), agent.log()[-2000:]
        with agent.client() as c:                           # and the apply, made again, goes through
            post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC})
        assert layouts(agent) != before


def test_a_driver_loaded_after_the_daemon_started_gets_the_configured_layout():
    """As on GPU-operator nodes, where the driver comes from a container after boot."""
    from hostagent.sim import control
    from hostagent.sim.store import SimStore
    root = make_root()
    store = SimStore(root)
    control.set_driver_loaded(store, False)
    with running_agent(root, {"mig": {"config": "all-balanced"}, "api": {"watch_heartbeat": 2},
                              "daemon": {"resync_interval": 0}}) as agent:
        assert "it is applied when the driver is loaded" in agent.log()
        control.set_driver_loaded(store, True)
        with agent.client() as c:
            c.refresh()
            until(lambda: all(g["mig"]["mode"]["current"] == "enabled" for g in c.get("/v1/mig")["gpus"]), 30,
                  agent.log, interval=0.1)
            assert len(c.devices(type="mig")["mig_devices"]) == 8 * 4       # 2x 1g, 2g, 3g each
        assert "MIG config 'all-balanced' applied to 8 GPU(s) (driver loaded)" in agent.log()


def signalling_reset(root, note):
    """Wrap the node's nvidia-smi: a reset first sends SIGTERM to its caller (the daemon),
    as systemd does when a stop comes in the middle of an apply, and records that it did."""
    smi = root / "usr/bin/nvidia-smi"
    smi.rename(smi.with_name("nvidia-smi.real"))
    smi.write_text(f'#!/bin/sh\ncase " $* " in *" -r "*) echo reset >> {note}; kill -TERM $PPID; sleep 0.5;; esac\n'
                   f'exec {smi.with_name("nvidia-smi.real")} "$@"\n')
    smi.chmod(0o755)


def test_sigterm_during_the_start_up_apply_rolls_it_back_and_stops():
    """systemd stopping the daemon while its start-up layout is applied: the apply stops
    before its next GPU and rolls back, the daemon exits 0 without serving, no journal left."""
    root = make_root()
    resets = root / "resets"
    signalling_reset(root, resets)
    agent = AgentProcess(root, {"mig": {"config": "all-1g.5gb"}})
    with driver_client(root), contextlib.ExitStack() as stack:
        stack.callback(agent.cleanup)
        agent.start(wait=False)
        assert agent.proc.wait(60) == 0, agent.log()
        log = agent.log()
        assert "was interrupted after" in log and "rolled back to the previous layout" in log, log
        assert "stopping: asked to stop during start-up" in log
        assert resets.read_text().count("reset") == 2        # the apply's, the rollback's
        assert not (root / "var/lib/hostagent/mig/journal.json").exists()
        assert not agent.socket.exists()
        out = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root),
                              "devices", "-o", "json"], capture_output=True, text=True, check=True)
        gpus = json.loads(out.stdout)["gpus"]
        assert [g["mig"]["mode"] for g in gpus] == [{"current": "disabled", "pending": "disabled"}] * 8


def test_sigterm_during_an_api_apply_rolls_it_back():
    root = make_root()
    resets = root / "resets"
    agent = AgentProcess(root)
    with driver_client(root), contextlib.ExitStack() as stack:
        stack.callback(agent.cleanup)
        stack.callback(agent.stop)
        agent.start()
        signalling_reset(root, resets)
        before = layouts(agent)
        with agent.client(timeout=60) as c:
            with pytest.raises(HostagentError) as e:
                post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC})
        assert e.value.code == "mig_apply_interrupted" and e.value.status == 409, e.value
        assert "rolled back to the previous layout" in str(e.value)
        assert agent.proc.wait(30) == 0, agent.log()
        assert not (root / "var/lib/hostagent/mig/journal.json").exists()
        agent.start()
        assert layouts(agent) == before


def test_devices_an_unreadable_checkpoint_record_may_hold_stay_until_an_admin_dismisses_it(tmp_path):
    """An allocation's record damaged on disk: the MIG device it names is held as the
    record's, named as such, by a plan's busy list, an apply (the API's, and the command
    line's through the daemon) and a destroy, until an admin dismisses the record; a
    change that leaves the device alone goes through meanwhile."""
    from hostagent.daemon import checkpoint

    from .test_allocation_attacks import damage_line_of
    root = make_root()
    with running_agent(root) as agent:
        with agent.client() as c:
            post(c, "/v1/mig/apply", {"config": "two", "spec": SPEC})
            c.allocate("first", ["5"])                          # the first save: a snapshot
            uuid = c.allocate("on-mig", [{"constraints": {"profile": "3g.20gb"}}])["devices"][0]
        agent.stop()
        damage_line_of(checkpoint.journal_path(agent.host), "on-mig")
        agent.start()
        with agent.client() as c:
            assert [a["id"] for a in c.allocations()] == ["first"]
            kept_as = c.node()["checkpoint"]["unreadable"][0]["kept_as"]
            [busy] = c.mig_plan("none", SPEC)["busy"]
            assert busy == {"id": "unreadable checkpoint record 1", "labels": {}, "devices": [uuid],
                            "unreadable": {"kept_as": kept_as, "reason": busy["unreadable"]["reason"]}}
            with pytest.raises(ConflictError) as e:
                post(c, "/v1/mig/apply", {"config": "none", "spec": SPEC})
            assert e.value.code == "device_busy" and "unreadable allocations checkpoint record" in e.value.message
            assert "dismiss-unreadable" in e.value.message
            with pytest.raises(ConflictError):
                c.request("DELETE", f"/v1/mig/instances/{uuid}")
            other = next(m for m in c.devices(type="mig")["mig_devices"] if m["uuid"] != uuid)
            c.request("DELETE", f"/v1/mig/instances/{other['uuid']}")     # not held: destroyed
        spec = tmp_path / "mig.yaml"
        spec.write_text(json.dumps(SPEC))
        cli = [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root)]
        done = subprocess.run([*cli, "mig", "apply", "-f", str(spec), "-c", "none"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1 and "unreadable allocations checkpoint record" in done.stderr, done.stderr
        with agent.client() as c:
            assert uuid in {m["uuid"] for m in c.devices(type="mig")["mig_devices"]}
        done = subprocess.run([*cli, "allocations", "dismiss-unreadable"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        with agent.client() as c:
            assert c.mig_plan("none", SPEC)["busy"] == []
            post(c, "/v1/mig/apply", {"config": "none", "spec": SPEC})
            assert c.devices(type="mig")["mig_devices"] == []
