"""The daemon's driver readiness gate: verified at start, reload and on request; degraded
and saying why while the driver does not verify (no CDI spec, MIG change or allocation);
the GPU operator's driver-ready marker while it does."""

import os
import signal

import pytest

from hostagent.errors import UnavailableError
from hostagent.sim import faults
from hostagent.sim.store import SimStore
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import AgentProcess, make_root, running_agent
from .test_daemon_lifecycle import NotifySocket

pytestmark = GPU_CHANGES

MARKER = "run/nvidia/validations/driver-ready"
SPEC = "var/run/cdi/nvidia.com-gpu.json"


def test_a_verified_driver_opens_the_gate_and_writes_the_operator_marker():
    root = make_root("hgx-h100")
    stale = root / MARKER
    stale.parent.mkdir(parents=True)
    stale.write_text("# written by hostagent\nIS_HOST_DRIVER=stale\n")      # left by a killed daemon
    with running_agent(root) as agent:
        with agent.client() as c:
            driver = c.driver()
            assert driver["state"] == "ready" and driver["ready"] and driver["failed"] == []
            assert [ch["name"] for ch in driver["checks"]][:3] == ["kernel-module", "nouveau", "version-match"]
            assert driver["markers"] == {"enabled": True, "path": str(root / MARKER), "written": True}
            assert c.node()["driver"] == {"state": "ready", "ready": True, "reason": "driver 550.90.07 verified",
                                          "version": "550.90.07", "failed": []}
            assert "hostagent_driver_ready 1.0" in c.metrics()
            assert 'hostagent_driver_check{check="fabric",result="ok"} 1.0' in c.metrics()
        # The validator's keys, sourceable as shell.
        assert (root / MARKER).read_text() == ("# written by hostagent\n"
                                                "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n"
                                                "NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n")
        assert oct((root / MARKER).stat().st_mode & 0o777) == "0o644"
        assert (root / SPEC).exists()
        assert agent.stop() == 0
        assert not (root / MARKER).exists()                  # removed at stop, as the validator's preStop


def test_a_broken_driver_degrades_the_daemon_until_it_is_fixed():
    root = make_root("hgx-h100")
    store = SimStore(root)
    faults.inject(store, "mismatch", version="550.127.05")
    name = "@hostagent-driver-test-%d" % os.getpid()
    notify = NotifySocket(name)
    agent = AgentProcess(root, {"mig": {"config": "all-1g.10gb"}, "api": {"watch_heartbeat": 2},
                                "daemon": {"resync_interval": 0}, "driver": {"retry_max": 1}},
                         env={"NOTIFY_SOCKET": name})
    try:
        agent.start()
        ready = notify.wait_for("READY", "1")
        assert ready["STATUS"].startswith("degraded, retrying: the driver does not verify: version-match: "
                                          "Driver/library version mismatch: user-space libraries 550.127.05, "
                                          "kernel module 550.90.07")
        with agent.client() as c:
            driver = c.driver()
            assert driver["state"] == "degraded" and driver["failed"] == ["version-match", "nvml"]
            assert not driver["markers"]["written"] and not (root / MARKER).exists()
            assert c.node()["driver"]["state"] == "degraded"
            assert not (root / SPEC).exists()                # no CDI spec on a broken driver
            with pytest.raises(UnavailableError) as e:
                c.allocate("a", ["0"])
            assert e.value.status == 503
            with pytest.raises(UnavailableError) as e:
                c.mig_apply("all-disabled")
            assert e.value.code == "driver_not_ready" and "version-match" in str(e.value)
            events = c.watch(since=c.node()["revision"])
            # The admin's fix: reload the module (the new one is on disk).
            faults.clear(store, "mismatch")
            until(lambda: c.driver()["ready"], 20, "reopening of the gate by itself")
            event = until(lambda: next((e for e in events if e["type"] == "driver_changed"), None), 20, "driver_changed event")
            assert event["driver"]["state"] == "ready" and event["driver"]["version"] == "550.127.05"
            events.close()
            assert until(lambda: (root / SPEC).exists(), 20, "CDI spec once verified")
            assert (root / MARKER).exists()
            # The layout that waited for the driver is applied.
            until(lambda: len(c.devices(type="mig")["mig_devices"]) == 8 * 7, 60, agent.log)
            assert c.allocate("a", ["0:0"])["devices"]
        assert "it is applied when the driver is loaded and verifies" in agent.log()
        status = until(lambda: next((m["STATUS"] for m in reversed(notify.pending()) if "STATUS" in m), None),
                       20, "STATUS")
        assert status.startswith("serving 8 GPU(s)")
    finally:
        agent.stop()
        notify.close()
        agent.cleanup()


def test_a_driver_that_breaks_while_serving_closes_the_gate():
    root = make_root("t4x2")
    store = SimStore(root)
    with running_agent(root, {"daemon": {"resync_interval": 0}, "driver": {"interval": 0}}) as agent:
        with agent.client() as c:
            assert c.driver()["ready"] and (root / MARKER).exists()
            spec = (root / SPEC).read_text()
            faults.inject(store, "no-uvm")
            agent.signal(signal.SIGHUP)                      # a reload verifies again
            driver = until(lambda: (d := c.driver())["state"] == "degraded" and d, 20, "degraded driver")
            nodes = next(ch for ch in driver["checks"] if ch["name"] == "device-nodes")
            assert nodes["result"] == "fail" and "/dev/nvidia-uvm: missing" in nodes["evidence"]
            assert "nvidia-modprobe -u" in nodes["fix"]
            assert not (root / MARKER).exists()
            assert (root / SPEC).read_text() == spec         # left as it was, not rewritten
            metrics = c.metrics()
            assert "hostagent_driver_ready 0.0" in metrics
            assert 'hostagent_driver_check{check="device-nodes",result="fail"} 1.0' in metrics
            faults.clear(store, "no-uvm")
            verified = c.verify_driver()
            assert verified["state"] == "ready" and verified["verifications"] >= 3
            assert (root / MARKER).exists()
        assert "driver not usable (reload): device-nodes: 2 device node(s) missing or wrong" in agent.log()


def test_the_gate_can_be_turned_off_and_checks_ignored(tmp_path):
    root = make_root("hgx-h100")
    faults.inject(SimStore(root), "fm-down")
    with running_agent(root, {"daemon": {"resync_interval": 0}, "driver": {"ignore": ["fabric"]}}) as agent:
        with agent.client() as c:
            driver = c.driver()
            assert driver["ready"] and next(ch for ch in driver["checks"] if ch["name"] == "fabric")["result"] == "fail"
            agent.write_config({"daemon": {"resync_interval": 0}, "driver": {"gate": False, "markers": False}})
            agent.signal(signal.SIGHUP)
            until(lambda: c.driver()["state"] == "disabled", 20, "gate turned off")
            assert not (root / MARKER).exists()
            assert c.allocate("x", ["0"])["devices"]


def test_metrics_are_served_while_an_install_holds_the_sampler():
    """Maintenance stops the sampler (it lets go of NVML); the endpoint stays up and says so."""
    import urllib.request

    from .test_daemon_lifecycle import _free_port
    port = _free_port()
    agent = AgentProcess(make_root("t4x2"), {"daemon": {"resync_interval": 0}, "driver": {"interval": 0},
                                             "metrics": {"port": port, "interval": 1}}).start()

    def scrape():
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    try:
        with agent.client() as c:
            until(lambda: "DCGM_FI_DEV_GPU_TEMP{" in scrape(), 20, "GPU series")
            c.request("POST", "/v1/driver/maintenance", {"pid": os.getpid(), "operation": "driver install test"})
            for text in (scrape(), c.metrics()):
                assert "hostagent_driver_ready 0.0" in text and "DCGM_FI_DEV_GPU_TEMP" not in text
                assert 'hostagent_scrape_collector_success{collector="gpu"} 0.0' in text
            c.request("DELETE", "/v1/driver/maintenance")
            until(lambda: "DCGM_FI_DEV_GPU_TEMP{" in scrape(), 20, "sampler coming back")
            assert 'hostagent_scrape_collector_success{collector="gpu"} 1.0' in scrape()
    finally:
        agent.stop()
        agent.cleanup()
