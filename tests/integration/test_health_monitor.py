"""The health monitor on simulated nodes, with faults injected through the sim CLI in
separate processes while the monitor runs."""

import os
import queue
import subprocess
import sys
import time

import pytest

from hostagent.devices import read_inventory
from hostagent.health import HealthMonitor, HealthOptions
from hostagent.sim import control
from hostagent.sim.node import MIG_ENABLE
from tests.waiting import until

CLI = [sys.executable, "-m", "hostagent.cli.main"]


def sim(host, *args):
    subprocess.run(CLI + ["--simulate", str(host.root), "sim", *map(str, args)], check=True,
                   capture_output=True, text=True, timeout=60)


def hostagent(host, *args, check=True, timeout=60):
    return subprocess.run(CLI + ["--simulate", str(host.root), *map(str, args)], check=check,
                          capture_output=True, text=True, timeout=timeout)


def mig_layout(store, gpu, gi_profiles, ci_profile=None):
    """MIG on ``gpu`` with one GI per profile id, each with a full compute instance (or
    every compute instance of ``ci_profile``)."""
    with store.mutate() as s:
        s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
        s.reset_gpu(gpu)
        for pid in gi_profiles:
            gi = s.create_gi(store.facts, gpu, pid)
            prof = store.facts.skus[s.gpus[gpu].sku].mig.by_id(pid)
            if ci_profile is None:
                s.create_ci(store.facts, gpu, gi.id, max(prof.ci_profiles, key=lambda c: c.slices).id)
            else:
                for _ in range(prof.ci_profile(ci_profile).instances):
                    s.create_ci(store.facts, gpu, gi.id, ci_profile)


class Watcher:
    def __init__(self, monitor):
        self.updates = queue.Queue()
        monitor.subscribe(self.updates.put)

    def next(self, timeout=10.0, *, cause=None):
        deadline = time.monotonic() + timeout
        while True:
            update = self.updates.get(timeout=max(0.01, deadline - time.monotonic()))
            if cause is None or update.cause == cause:
                return update

    def event(self, kind, timeout=10.0):
        while True:
            update = self.next(timeout, cause="event")
            if update.event.kind == kind:
                return update


@pytest.fixture
def running(make_node):
    monitors = []

    def start(profile="dgx-a100", layout=None, allocations=None, **options):
        host, store = make_node(profile)
        if layout:
            layout(store)
        options.setdefault("quiet_period", 30.0)
        options.setdefault("wait_timeout_ms", 200)
        monitor = HealthMonitor(host, read_inventory(host), HealthOptions(**options),
                                allocations=allocations)
        watcher = Watcher(monitor)
        monitor.start()
        monitors.append(monitor)
        return host, store, monitor, watcher
    yield start
    for m in monitors:
        m.stop()


def a100_mig(store):
    mig_layout(store, 0, [19] * 7)                 # GPU 0: seven 1g.5gb
    mig_layout(store, 1, [9], ci_profile=0)        # GPU 1: a 3g.20gb split into three 1c


def test_gpu_wide_xid_reaches_the_gpu_every_mig_device_and_allocation(running):
    allocations = {}
    host, store, monitor, w = running(layout=a100_mig, allocations=lambda k: allocations.get(k, ()))
    inv = read_inventory(host)
    gpu0 = inv.gpus[0]
    migs = [d.uuid for d in gpu0.mig.devices]
    assert len(migs) == 7
    allocations.update({migs[0]: ["claim-a"], migs[3]: ["claim-b", "claim-c"]})
    sim(host, "xid", "--gpu", 0, "--xid", 48)
    update = w.event("xid")
    ev = update.event
    assert (ev.gpu, ev.xid, ev.ignored, ev.gi, ev.ci) == (0, 48, False, None, None)
    assert ev.devices == (gpu0.uuid, *migs)
    assert ev.allocations == ("claim-a", "claim-b", "claim-c")
    assert {d.key for d in update.changes} == {gpu0.uuid, *migs}
    assert {d.key for d in monitor.state.unhealthy} == {gpu0.uuid, *migs}   # GPU 1 untouched


def test_instance_scoped_xid_only_reaches_that_instance(running):
    host, store, monitor, w = running(layout=a100_mig)
    gpu1 = read_inventory(host).gpus[1]
    cis = {d.ci: d for d in gpu1.mig.devices}
    assert len(cis) == 3 and len({d.gi for d in cis.values()}) == 1
    gi = cis[0].gi
    sim(host, "xid", "--gpu", 1, "--xid", 94, "--gi", gi, "--ci", 2)
    ev = w.event("xid").event
    assert (ev.gi, ev.ci, ev.devices) == (gi, 2, (cis[2].uuid,))
    assert [d.key for d in monitor.state.unhealthy] == [cis[2].uuid]
    sim(host, "xid", "--gpu", 1, "--xid", 94, "--gi", gi)        # the whole GPU instance
    ev = w.event("xid").event
    assert set(ev.devices) == {d.uuid for d in cis.values()}
    assert monitor.state.get(gpu1.uuid).healthy                  # the parent GPU is not touched


def test_ignored_xid_is_recorded_but_healthy(running):
    host, store, monitor, w = running(profile="t4x2")
    sim(host, "xid", "--gpu", 1, "--xid", 31)
    update = w.event("xid")
    assert update.event.ignored and update.event.xid == 31
    dev = monitor.state.get(update.event.gpu_uuid)
    assert dev.healthy and dev.last_xid == 31 and not monitor.state.unhealthy


def test_recovery_after_the_quiet_period(running):
    host, store, monitor, w = running(profile="t4x2", quiet_period=0.6)
    sim(host, "xid", "--gpu", 0, "--xid", 63)
    t0 = w.event("xid").event.at            # the quiet period counts from the event itself
    assert len(monitor.state.unhealthy) == 1
    recovered = w.next(cause="recovered", timeout=5)
    assert recovered.changes[0].healthy and recovered.changes[0].last_xid == 63
    assert 0.6 <= recovered.at - t0 < 1.5
    assert not monitor.state.unhealthy


def test_explicit_clear_in_process_and_from_the_cli(running):
    host, store, monitor, w = running(layout=a100_mig, quiet_period=None)
    sim(host, "ecc", "--gpu", 0)
    assert w.event("ecc_dbe").event.devices[0] == read_inventory(host).gpus[0].uuid
    sim(host, "xid", "--gpu", 2, "--xid", 48)
    w.event("xid")
    assert len(monitor.state.unhealthy) == 9
    update = monitor.clear(["2"])
    assert [d.name for d in update.changes] == ["2"] and len(monitor.state.unhealthy) == 8
    # from another process, through the run directory
    out = hostagent(host, "health", "clear", "0:6")
    assert out.stdout.strip() == "cleared: 0:6"
    out = hostagent(host, "health", "clear", "--all")
    assert out.stdout.startswith("cleared: 0, ") and not monitor.state.unhealthy
    out = hostagent(host, "health", "clear", "9:9", check=False)
    assert out.returncode == 1 and "no device '9:9'" in out.stderr


def test_lost_gpu_marks_its_devices_until_cleared(running):
    host, store, monitor, w = running(layout=a100_mig, quiet_period=0.3)
    inv = read_inventory(host)
    sim(host, "lose", "--gpu", 0)
    assert w.event("xid").event.xid == 79
    lost = w.event("gpu_lost")
    assert lost.event.devices == (inv.gpus[0].uuid, *(d.uuid for d in inv.gpus[0].mig.devices))
    until(lambda: len(monitor.state.unhealthy) == 8)    # once past the quiet period
    assert all(any(r.sticky for r in d.reasons) for d in monitor.state.unhealthy)
    sim(host, "xid", "--gpu", 3, "--xid", 48)           # the other GPUs are still watched
    assert w.event("xid").event.gpu == 3


def test_lost_gpu_keeps_its_uuid_across_reads_and_is_watched_again_once_readable(running, monkeypatch):
    monkeypatch.setattr("hostagent.health.monitor.LOST_RETRY", 0.2)
    host, store, monitor, w = running(profile="t4x2", quiet_period=0.3)
    uuids = [g.uuid for g in read_inventory(host).gpus]
    sim(host, "lose", "--gpu", 0)
    w.event("gpu_lost")
    for _ in range(3):                                  # the daemon re-reads the inventory
        inv = read_inventory(host)
        assert [g.index for g in inv.unreadable] == [0]
        monitor.update_inventory(inv)
        time.sleep(0.4)                                 # past the quiet period, and retries
        until(lambda: monitor.state.get(uuids[0]).state == "unhealthy")
        assert list(monitor.state.devices) == uuids
        gpu0 = monitor.state.get(uuids[0])
        assert gpu0.lost and not gpu0.monitored
    assert [d.key for d in monitor.state.unhealthy] == [uuids[0]]
    # cleared while still lost: nothing watches it, so it is unmonitored, not healthy
    update = monitor.clear(["0"])
    assert [(d.name, d.state) for d in update.changes] == [("0", "unmonitored")]
    sim(host, "reboot")                                 # readable again
    update = w.next(cause="monitoring")
    assert [(d.key, d.state, d.lost) for d in update.changes] == [(uuids[0], "healthy", False)]
    sim(host, "xid", "--gpu", 0, "--xid", 48)           # and watched
    assert w.event("xid").event.devices == (uuids[0],)
    assert monitor.state.get(uuids[0]).state == "unhealthy"


def test_a_replacing_monitor_carries_health_over(make_node):
    """A reload with new settings, or a restart, replaces the monitor: health, last XIDs and
    lost GPUs carry over, re-evaluated under the new XID policy."""
    host, store = make_node("t4x2")
    uuids = [g.uuid for g in read_inventory(host).gpus]

    def monitor(previous=None, **options):
        m = HealthMonitor(host, read_inventory(host), HealthOptions(wait_timeout_ms=200, **options),
                          previous=previous)
        w = Watcher(m)
        m.start()
        return m, w

    first, w = monitor(quiet_period=None)
    try:
        sim(host, "xid", "--gpu", 0, "--xid", 48)
        w.event("xid")
        sim(host, "lose", "--gpu", 1)
        w.event("gpu_lost")
    finally:
        first.stop()
    before = first.state
    second, w = monitor(before, quiet_period=None)             # same settings
    try:
        assert second.state.devices == before.devices         # nothing changed, nothing re-reported
        assert second.last_xids() == {uuids[0]: 48, uuids[1]: 79}
        assert second.state.get(uuids[1]).lost
        with pytest.raises(queue.Empty):
            w.next(timeout=0.5, cause="event")                # the lost GPU is not "lost again"
    finally:
        second.stop()
    third, w = monitor(second.state, quiet_period=None, disable_xids=(48,))
    try:
        gpu0 = third.state.get(uuids[0])
        assert gpu0.state == "healthy" and gpu0.last_xid == 48   # 48 is ignored now
        assert third.state.get(uuids[1]).state == "unhealthy"    # lost stays lost
    finally:
        third.stop()


def test_refused_registration_is_unmonitored_never_healthy(make_node):
    host, store = make_node("t4x2")
    control.set_event_support(store, 0, False)
    monitor = HealthMonitor(host, read_inventory(host), HealthOptions(wait_timeout_ms=200))
    monitor.start()
    try:
        gpu0 = monitor.state.get(read_inventory(host).gpus[0].uuid)
        assert gpu0.state == "unmonitored" and "Not Supported" in gpu0.monitor_detail
        assert monitor.state.get(read_inventory(host).gpus[1].uuid).state == "healthy"
        out = hostagent(host, "health", "status")
        assert " unmonitored " in out.stdout and "event registration" in out.stdout
    finally:
        monitor.stop()


def test_no_driver_means_unmonitored_then_recovers(make_node):
    host, store = make_node("t4x2")
    inv = read_inventory(host)
    control.set_driver_loaded(store, False)
    monitor = HealthMonitor(host, inv, HealthOptions(wait_timeout_ms=200))
    w = Watcher(monitor)
    monitor.start()
    try:
        assert {d.state for d in monitor.state.devices.values()} == {"unmonitored"}
        control.set_driver_loaded(store, True)
        update = w.next(cause="monitoring", timeout=10)
        assert {d.state for d in update.changes} == {"healthy"} and len(update.changes) == 2
    finally:
        monitor.stop()


def test_mig_change_followed(running):
    host, store, monitor, w = running(quiet_period=None)
    sim(host, "xid", "--gpu", 4, "--xid", 48)
    w.event("xid")
    mig_layout(store, 4, [9])                          # a new MIG device on the unhealthy GPU
    monitor.update_inventory(read_inventory(host))
    update = w.next(cause="inventory")
    assert [d.name for d in update.changes] == ["4:0"] and not update.changes[0].healthy


def test_watch_status_and_clear_across_processes(make_node):
    """The monitor in a subprocess (hostagent health watch); faults and clears from others."""
    host, store = make_node("a30x4")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(CLI + ["--simulate", str(host.root), "health", "watch", "-o", "json",
                                   "--quiet-period", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        import json
        first = json.loads(proc.stdout.readline())
        assert first["cause"] == "initial" and len(first["changes"]) == 4
        sim(host, "xid", "--gpu", 2, "--xid", 79)
        line = json.loads(proc.stdout.readline())
        assert line["event"]["kind"] == "xid" and line["event"]["xid"] == 79
        assert [c["state"] for c in line["changes"]] == ["unhealthy"]
        status = json.loads(hostagent(host, "health", "status", "-o", "json").stdout)
        assert status["stale"] is False and status["pid"] == proc.pid
        assert [d["name"] for d in status["devices"] if d["state"] == "unhealthy"] == ["2"]
        assert hostagent(host, "health", "clear", "2").stdout.strip() == "cleared: 2"
        line = json.loads(proc.stdout.readline())
        assert line["cause"] == "cleared" and line["changes"][0]["state"] == "healthy"
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0, proc.stderr.read()
    out = hostagent(host, "health", "status")
    assert "not running" in out.stderr
    out = hostagent(host, "health", "clear", "--all", "--timeout", "0.5", check=False)
    assert out.returncode == 1 and "no health monitor answered" in out.stderr


def test_device_plugin_variables_set_the_xid_lists(make_node):
    """DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS, as a device plugin DaemonSet sets
    them, where the config file sets no list."""
    host, store = make_node("t4x2")
    env = dict(os.environ, PYTHONUNBUFFERED="1", DP_DISABLE_HEALTHCHECKS="48,63")
    proc = subprocess.Popen(CLI + ["--simulate", str(host.root), "health", "watch"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert "ignored XIDs: 13, 31, 43, 45, 48, 63, 68, 109;" in proc.stderr.readline()
        sim(host, "xid", "--gpu", 1, "--xid", 48)
        assert proc.stdout.readline().split("] ", 1)[1] == "xid 48 (ignored) on GPU 1 -> no change\n"
    finally:
        proc.terminate()
        proc.wait(10)
    env["DP_ENABLE_HEALTHCHECKS"] = "48;63"
    out = subprocess.run(CLI + ["--simulate", str(host.root), "health", "watch"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.startswith("hostagent: error: DP_ENABLE_HEALTHCHECKS: '48;63'")
