"""Driver upgrades across the fleet, part by part: the ConfigMap read, the walk's planner,
which pods move, the slot Leases judged (free, expired, halted) and written against the
test API server (409s, take-over after expiry, renewal)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("lightkube", reason="lightkube is a dependency")

from hostagent.plugins.nodecontroller import gpupods, slots  # noqa: E402
from hostagent.plugins.nodecontroller import upgradeplan as up  # noqa: E402
from hostagent.plugins.nodecontroller.kube import NodeApi, load_config  # noqa: E402
from hostagent.plugins.nodecontroller.watcher import Collection  # noqa: E402
from tests.integration.kubeapi import TestApiServer  # noqa: E402
from tests.waiting import until  # noqa: E402

V = "550.127.05"
TROUBLESHOOTING = (Path(__file__).resolve().parents[2] / "docs/troubleshooting.md").read_text()
WANT = up.Desired(V)
READY_OLD = up.AgentFacts(True, True, False, "550.90.07")
NO_SLOT = up.SlotFacts()


def cm(**data) -> dict:
    return {"metadata": {"namespace": "hostagent", "name": "hostagent-driver"}, "data": data}


# ---- the ConfigMap -----------------------------------------------------------------------

def test_the_configmap_is_read_with_its_defaults_and_refused_in_one_line():
    assert up.desired(None) == (None, None)
    assert up.desired(cm(version=V)) == (up.Desired(V, 1, 300, False), None)
    assert up.desired(cm(version=V, maxParallelUpgrades="0", podDeletionTimeoutSeconds="30",
                         podDeletionForce="True")) == (up.Desired(V, 0, 30, True), None)
    refused = {
        "ConfigMap hostagent/hostagent-driver: no version (a full driver version, such as 550.127.05)": cm(),
        "ConfigMap hostagent/hostagent-driver: version 'latest' is not a driver version (one like 550.127.05)":
            cm(version="latest"),
        "ConfigMap hostagent/hostagent-driver: maxParallelUpgrades '-1' is not a whole number of 0 or more":
            cm(version=V, maxParallelUpgrades="-1"),
        "ConfigMap hostagent/hostagent-driver: podDeletionForce 'yes' is not true or false":
            cm(version=V, podDeletionForce="yes"),
        "ConfigMap hostagent/hostagent-driver: unknown key 'maxParalelUpgrades' (did you mean "
        "'maxParallelUpgrades'?)": cm(version=V, maxParalelUpgrades="2"),
    }
    for message, configmap in refused.items():
        assert up.desired(configmap) == (None, message)
    # Each has its row (docs/troubleshooting.md shows them as they read).
    for says in ("ConfigMap NS/hostagent-driver: version 'latest' is not a driver version (one like 550.127.05)",
                 "`no version ...`", "is not a whole number of 0 or more", "is not true or false", "unknown key 'K'"):
        assert says in TROUBLESHOOTING, says


def test_what_a_failed_or_halted_upgrade_says_has_its_row():
    """docs/troubleshooting.md names each Warning a driver upgrade can give, as it reads."""
    held = up.SlotFacts(held="hostagent-driver-upgrade-0")
    walk = node(up.POD_RESTART_REQUIRED, V, 150.0)
    for report, says in ((job("failed", error="no repository offers nvidia-driver 550.127.05 (offered: ...)"),
                          "was not installed: no repository offers nvidia-driver"),
                         (job("rolled-back", error="x", outcome={"previous": "550.90.07"}),
                          "did not work and was rolled back to")):
        step = up.next_step(WANT, walk, up.AgentFacts(True, True, False, "550.90.07", report), held)
        assert says in step.why and says in TROUBLESHOOTING
    bare = up.next_step(WANT, up.NodeFacts(up.CORDON_REQUIRED), READY_OLD, held)
    assert bare.do == up.FAIL and bare.why.endswith(": nothing says which version")
    assert "without hostagent.io/driver-upgrade.version: nothing says which version" in TROUBLESHOOTING
    mark = {"node": "n1", "version": V, "reason": "r"}
    halted = slots.halted({"l": slots.released(lease("l"), mark)}, V, "n2")
    assert halted.split(" ", 1)[1].startswith("failed to upgrade to") and "`N failed to upgrade to V: ...`" in \
        TROUBLESHOOTING


# ---- the walk -------------------------------------------------------------------------------

def node(state="", version=None, admitted=None, skip=False) -> up.NodeFacts:
    return up.NodeFacts(state, skip, version, admitted)


def test_a_node_at_rest_joins_the_rollout_and_waits_for_a_slot():
    step = up.next_step(WANT, node(), READY_OLD, NO_SLOT)
    assert (step.do, step.state, step.version) == (up.MARK, up.UPGRADE_REQUIRED, V)
    required = node(up.UPGRADE_REQUIRED, V)
    assert up.next_step(WANT, required, READY_OLD, NO_SLOT).do == up.ACQUIRE
    assert up.next_step(up.Desired(V, 0), required, READY_OLD, NO_SLOT).why.startswith("the rollout is paused")
    halted = up.next_step(WANT, required, READY_OLD, up.SlotFacts(halted="n2 failed to upgrade to X: why"))
    assert (halted.do, halted.why) == (up.WAIT, "the rollout is halted: n2 failed to upgrade to X: why")
    admit = up.next_step(WANT, required, READY_OLD, up.SlotFacts(held="hostagent-driver-upgrade-0"))
    assert (admit.do, admit.state) == (up.ADMIT, up.CORDON_REQUIRED)
    # Nothing without a ConfigMap, for a node left out, or before the agent says its driver.
    assert up.next_step(None, node(), READY_OLD, NO_SLOT).do == up.WAIT
    assert up.next_step(WANT, node(skip=True), READY_OLD, NO_SLOT).do == up.WAIT
    assert up.next_step(WANT, node(), up.AgentFacts(), NO_SLOT).do == up.WAIT
    # A node at the version is done; an upgrade-required one whose version changed is marked again.
    at = up.AgentFacts(True, True, False, V)
    assert up.next_step(WANT, required, at, NO_SLOT).state == up.UPGRADE_DONE
    assert up.next_step(WANT, node(up.UPGRADE_DONE, V), at, NO_SLOT).do == up.WAIT
    assert up.next_step(WANT, node(up.UPGRADE_REQUIRED, "535.216.03"), READY_OLD, NO_SLOT).version == V


def test_the_walk_goes_step_by_step():
    held = up.SlotFacts(held="hostagent-driver-upgrade-0")
    for state, do, then in ((up.CORDON_REQUIRED, up.CORDON, up.POD_DELETION_REQUIRED),
                            (up.POD_DELETION_REQUIRED, up.EVICT, up.POD_RESTART_REQUIRED),
                            (up.POD_RESTART_REQUIRED, up.INSTALL, None),
                            (up.VALIDATION_REQUIRED, up.VALIDATE, up.UNCORDON_REQUIRED),
                            (up.UNCORDON_REQUIRED, up.UNCORDON, up.UPGRADE_DONE)):
        step = up.next_step(WANT, node(state, V, 100.0), READY_OLD, held)
        assert (step.do, step.state, step.version) == (do, then, V), state
    # A walking node whose slot was lost takes one again before anything else.
    assert up.next_step(WANT, node(up.POD_DELETION_REQUIRED, V, 100.0), READY_OLD, NO_SLOT).do == up.ACQUIRE


def job(state, version=V, started=200.0, **more) -> dict:
    return {"state": state, "version": version, "started_at": started, "progress": "install: ...", **more}


def test_the_install_is_started_once_and_judged_by_the_agents_report():
    held = up.SlotFacts(held="hostagent-driver-upgrade-0")
    walk = node(up.POD_RESTART_REQUIRED, V, 150.0)

    def at(agent=READY_OLD, report=None) -> up.Step:
        return up.next_step(WANT, walk, up.AgentFacts(agent.connected, agent.ready, agent.busy, agent.version, report),
                            held)
    assert at(report=job("running")).do == up.AWAIT
    assert at(report=job("succeeded")).state == up.VALIDATION_REQUIRED
    # The driver in place is never installed again, whatever the report says.
    assert at(up.AgentFacts(True, True, False, V), None).state == up.VALIDATION_REQUIRED
    failed = at(report=job("failed", error="no repository offers nvidia-driver 550.127.05"))
    assert (failed.do, failed.why) == (up.FAIL, "the driver 550.127.05 was not installed: no repository offers "
                                                "nvidia-driver 550.127.05")
    back = at(report=job("rolled-back", error="it does not verify", outcome={"previous": "550.90.07"}))
    assert back.do == up.FAIL and "rolled back to 550.90.07: it does not verify" in back.why
    assert at(report=job("interrupted")) == up.Step(up.INSTALL, version=V, why="resumed")
    # An install of an earlier walk (before the slot was taken) or of another version is not this walk's.
    assert at(report=job("failed", started=100.0)).do == up.INSTALL
    assert at(report=job("succeeded", version="535.216.03")).do == up.INSTALL
    # The agent busy (verifying after the install, or away): wait for it.
    assert at(up.AgentFacts(True, False, True, None), job("succeeded")).do == up.WAIT
    assert at(up.AgentFacts(False), None).do == up.WAIT


def test_a_new_version_mid_walk_is_followed_unless_installing_or_done():
    held = up.SlotFacts(held="hostagent-driver-upgrade-0")
    new = up.Desired("570.86.15", 2)
    step = up.next_step(new, node(up.POD_DELETION_REQUIRED, V, 100.0), READY_OLD, held)
    assert (step.do, step.state, step.version) == (up.MARK, up.POD_DELETION_REQUIRED, "570.86.15")
    step = up.next_step(new, node(up.VALIDATION_REQUIRED, V, 100.0), READY_OLD, held)
    assert (step.state, step.version) == (up.POD_RESTART_REQUIRED, "570.86.15")          # installed again
    running = up.AgentFacts(True, False, True, None, job("running"))
    assert up.next_step(new, node(up.POD_RESTART_REQUIRED, V, 100.0), running, held).do == up.AWAIT
    assert up.next_step(new, node(up.UNCORDON_REQUIRED, V, 100.0), READY_OLD, held).do == up.UNCORDON
    # Without the ConfigMap (or paused) a walk goes on to its end.
    assert up.next_step(None, node(up.CORDON_REQUIRED, V, 100.0), READY_OLD, held).do == up.CORDON


def test_a_failed_node_waits_for_its_admin_and_its_mark_goes_when_it_no_longer_halts():
    failed = node(up.UPGRADE_FAILED, V)
    assert up.next_step(WANT, failed, READY_OLD, up.SlotFacts(mine_failed=True)).do == up.WAIT
    skipped = node(up.UPGRADE_FAILED, V, skip=True)
    assert up.next_step(WANT, skipped, READY_OLD, up.SlotFacts(mine_failed=True)).do == up.CLEAR
    # Retried by its admin (relabelled upgrade-required), or fixed by hand: the mark goes first.
    assert up.next_step(WANT, node(up.UPGRADE_REQUIRED, V), READY_OLD, up.SlotFacts(mine_failed=True)).do == up.CLEAR
    fixed = up.next_step(WANT, failed, up.AgentFacts(True, True, False, V), NO_SLOT)
    assert (fixed.do, fixed.state) == (up.UNCORDON, up.UPGRADE_DONE)
    # A new version is a new walk for a failed node.
    assert up.next_step(up.Desired("570.86.15"), failed, READY_OLD, NO_SLOT).state == up.UPGRADE_REQUIRED
    # A slot still held once the walk ended (a crash before the release) is released.
    done = node(up.UPGRADE_DONE, V)
    assert up.next_step(WANT, done, up.AgentFacts(True, True, False, V),
                        up.SlotFacts(held="hostagent-driver-upgrade-0")) == up.Step(up.RELEASE)
    # A failed walk's slot is released with the mark that halts the others (not left out of it).
    release = up.next_step(WANT, failed, READY_OLD, up.SlotFacts(held="hostagent-driver-upgrade-0"))
    assert (release.do, release.state, release.version) == (up.RELEASE, up.UPGRADE_FAILED, V) and release.why
    assert not up.next_step(WANT, skipped, READY_OLD, up.SlotFacts(held="hostagent-driver-upgrade-0")).why


# ---- which pods move --------------------------------------------------------------------------

def pod(name, phase="Running", limits=None, owner=None, claims=(), init=False, mirror=False) -> dict:
    container = {"name": "c", **({"resources": {"limits": limits}} if limits else {})}
    meta = {"name": name, "namespace": "ns"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o"}]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "x"}
    spec = {"initContainers" if init else "containers": [container]}
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def claim(driver: str, admin: bool = False) -> dict:
    return {"status": {"allocation": {"devices": {"results": [{"driver": driver, "adminAccess": admin}]}}}}


def test_gpu_pods_are_those_with_nvidia_resources_or_gpu_claims_but_not_daemonsets():
    pods = [pod("gpu", limits={"nvidia.com/gpu": "1"}), pod("mig", limits={"nvidia.com/mig-1g.5gb": "1"}),
            pod("init", limits={"nvidia.com/gpu": "1"}, init=True), pod("cpu", limits={"cpu": "1"}),
            pod("ds", limits={"nvidia.com/gpu": "1"}, owner="DaemonSet"), pod("job", limits={"nvidia.com/gpu": "1"},
                                                                                 owner="Job"),
            pod("done", phase="Succeeded", limits={"nvidia.com/gpu": "1"}),
            pod("static", limits={"nvidia.com/gpu": "1"}, mirror=True),
            pod("dra", claims=["c1"]), pod("other-dra", claims=["c2"]), pod("admin", claims=["c3"]),
            pod("unreadable", claims=["c4"])]
    claims = {("ns", "c1"): claim("gpu.nvidia.com"), ("ns", "c2"): claim("example.com/fpga"),
              ("ns", "c3"): claim("gpu.nvidia.com", admin=True), ("ns", "c4"): None}
    assert [n for _, n in gpupods.gpu_pods(pods, claims)] == ["dra", "gpu", "init", "job", "mig", "unreadable"]
    assert {n for p in gpupods.candidates(pods) for _, n in gpupods.claim_names(p)} == {"c1", "c2", "c3", "c4"}


# ---- the slot Leases ----------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def lease(name, holder=None, rv="1", duration=60, mark=None) -> dict:
    out = {"metadata": {"name": name, "namespace": "hostagent", "resourceVersion": rv},
           "spec": {"leaseDurationSeconds": duration, **({"holderIdentity": holder} if holder else {})}}
    return slots.released(out, mark) if mark else out


def test_a_slot_is_free_when_absent_released_or_unchanged_for_its_duration_on_this_clock():
    clock = Clock()
    seen = slots.Observed(clock)
    leases = {"hostagent-driver-upgrade-0": lease("hostagent-driver-upgrade-0", "a"),
              "hostagent-driver-upgrade-1": lease("hostagent-driver-upgrade-1", None)}
    assert slots.choose(leases, 1, seen) is None
    assert slots.choose(leases, 2, seen)[0] == "hostagent-driver-upgrade-1"
    assert slots.choose(leases, 3, seen)[0] == "hostagent-driver-upgrade-1"
    busy = {"hostagent-driver-upgrade-0": leases["hostagent-driver-upgrade-0"]}
    assert slots.choose(busy, 2, seen) == ("hostagent-driver-upgrade-1", None)       # created
    assert slots.next_expiry(busy, 1, seen) == 60.0
    clock.now += 59
    assert slots.choose(busy, 1, seen) is None
    renewed = {"hostagent-driver-upgrade-0": lease("hostagent-driver-upgrade-0", "a", rv="2")}
    clock.now += 2
    assert slots.choose(renewed, 1, seen) is None           # renewed: a new version, a new 60 s
    clock.now += 60
    assert slots.choose(renewed, 1, seen)[0] == "hostagent-driver-upgrade-0"          # expired


def test_a_failure_mark_halts_the_version_it_names_for_the_other_nodes():
    mark = {"node": "n1", "version": V, "reason": "no repository offers it"}
    leases = {"hostagent-driver-upgrade-0": lease("hostagent-driver-upgrade-0", mark=mark)}
    assert slots.halted(leases, V, "n2") == f"n1 failed to upgrade to {V}: no repository offers it"
    assert slots.halted(leases, "570.86.15", "n2") is None and slots.halted(leases, V, "n1") is None
    assert slots.my_marks(leases, "n1") == ["hostagent-driver-upgrade-0"]
    taken = slots.acquired(leases["hostagent-driver-upgrade-0"], "hostagent-driver-upgrade-0", "hostagent", "n3",
                           60, 0.0)
    assert slots.mark_of(taken) == mark                     # taking a slot keeps its marks
    assert slots.mark_of(slots.unmarked(taken)) is None


@pytest.fixture
def api(tmp_path):
    server = TestApiServer((1, 35)).start()
    client = NodeApi(load_config(str(server.kubeconfig(tmp_path / "kc"))))
    yield server, client
    client.close()
    server.stop()
    assert not server.rejected, server.rejected


def follow(client) -> Collection:
    leases = Collection("leases", lambda: client.list_leases("hostagent", slots.LABELS),
                        lambda rv: client.watch_leases("hostagent", slots.LABELS, rv), lambda items: None)
    leases.start()
    until(lambda: leases.listed, 10, "the Leases listed")
    return leases


def test_slots_are_taken_once_renewed_released_with_a_mark_and_taken_over_when_expired(api):
    server, client = api
    clock = Clock()
    a = slots.Slots(client, "hostagent", "a", follow(client), duration=1)
    b = slots.Slots(client, "hostagent", "b", follow(client), duration=1, clock=clock)
    try:
        assert a.acquire(1) == "hostagent-driver-upgrade-0"
        until(lambda: b.held() is None and "hostagent-driver-upgrade-0" in b.items, 10, "b seeing a's Lease")
        assert b.acquire(1) is None
        first = server.get("leases", "hostagent-driver-upgrade-0", "hostagent")["spec"]["renewTime"]
        until(lambda: server.get("leases", "hostagent-driver-upgrade-0", "hostagent")["spec"]["renewTime"] != first,
              5, "a renewal")                                # a third of its duration
        a.stop()                                             # a's node dies: no more renewals
        a._renewer.join(5)
        version = server.get("leases", "hostagent-driver-upgrade-0", "hostagent")["metadata"]["resourceVersion"]
        until(lambda: b.items["hostagent-driver-upgrade-0"]["metadata"]["resourceVersion"] == version, 5,
              "b seeing a's last renewal")
        stale = dict(b.items["hostagent-driver-upgrade-0"])
        b.observed.see(b.items)
        clock.now += 1.5                                     # unchanged for longer than its duration
        assert b.items["hostagent-driver-upgrade-0"]["metadata"]["resourceVersion"] == version
        assert b.acquire(1) == "hostagent-driver-upgrade-0"
        taken = server.get("leases", "hostagent-driver-upgrade-0", "hostagent")
        assert taken["spec"]["holderIdentity"] == "b" and taken["spec"]["leaseTransitions"] == 1
        # A stale write (a's renewal of the Lease as it last was) is refused with a 409.
        assert a._write(slots.renewed(stale, time.time())) is None
        assert server.get("leases", "hostagent-driver-upgrade-0", "hostagent")["spec"]["holderIdentity"] == "b"
        assert b.release({"node": "b", "version": V, "reason": "why"}) is True
        until(lambda: slots.my_marks(b.items, "b"), 5, "the mark seen")
        assert slots.halted(b.items, V, "c") == f"b failed to upgrade to {V}: why"
        b.clear_marks()
        assert slots.mark_of(server.get("leases", "hostagent-driver-upgrade-0", "hostagent")) is None
    finally:
        for s in (a, b):
            s.stop()
            s.leases.stop()


def test_a_watch_event_older_than_a_write_of_ours_does_not_undo_it():
    """The node takes a slot (its write answered at version 7) while the watch still brings
    version 6 (the Lease released by the node before). The Leases seen keep version 7: the
    renewer, which stops when the slot seems held by another, goes on."""
    name = "hostagent-driver-upgrade-0"
    before = lease(name, "a", rv="5")
    released, taken = lease(name, None, rv="6"), lease(name, "b", rv="7")

    def watch(version):
        leases.seen(taken)                   # the answer to our write comes first
        yield "MODIFIED", released
    leases = Collection("leases", lambda: ([before], "5"), watch, lambda items: None)
    leases._once()
    assert slots.held_by(leases.items, "b") == name and leases.version == "6"


def test_a_slot_is_released_as_this_node_held_it_never_as_another_took_it():
    """The watch brings another node's take-over of the Lease (it lapsed) while this node
    releases it: what is written is this node's Lease at its version (the API server
    refuses it, 409), never the other's Lease without its holder."""
    name = "hostagent-driver-upgrade-0"
    mine, theirs = lease(name, "a", rv="5"), lease(name, "b", rv="6")

    class Leases:                            # each look after the first finds the take-over
        looks = 0

        @property
        def items(self):
            self.looks += 1
            return {name: mine if self.looks == 1 else theirs}

        def seen(self, obj):
            pass
    written = []

    class Api:
        def replace_lease(self, body):
            written.append(body)
            return body
    assert slots.Slots(Api(), "hostagent", "a", Leases()).release() is True
    assert [(w["metadata"]["resourceVersion"], slots.holder(w)) for w in written] == [("5", None)]


def test_a_watch_the_credentials_do_not_allow_is_asked_for_again_only_as_often_as_a_watch_is_renewed():
    """The kubelet's credentials on a host may not read the ConfigMap or the Leases: that is
    said once, and asked again every 5 minutes, never polled."""
    from hostagent.plugins.kubeerror import KubeError
    from hostagent.plugins.nodecontroller.watcher import FORBIDDEN_RETRY, Follower

    class Stop:
        def __init__(self, errors):
            self.waits, self.errors = [], errors

        def is_set(self):
            return len(self.waits) >= 3

        def wait(self, seconds):
            self.waits.append(seconds)

    def read():
        raise KubeError("reading ConfigMap hostagent/hostagent-driver: forbidden", status=stop.errors.pop(0))
    stop = Stop([403, 503, 503])
    follower = Follower("the ConfigMap", read, lambda rv: iter(()), lambda obj: None, absent_ok=True)
    follower._stop = stop
    follower.run()
    assert stop.waits == [FORBIDDEN_RETRY, 1.0, 2.0] and FORBIDDEN_RETRY == 300
