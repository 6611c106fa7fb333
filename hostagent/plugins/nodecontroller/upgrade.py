"""Driver upgrades across the fleet, the executor: on a thread of its own (its steps take
minutes: evictions and their retries, the install), each pass gathers what the node's step
depends on, asks ``upgradeplan`` for it, and runs it, until the plan says to wait.

What it follows, all watched, never polled: the ConfigMap ``hostagent-driver`` (one
watch on its name), the slot Leases (``slots``: one watch on their label), its Node (the
controller's watch) and the agent (its link). Only while the agent installs does it ask
the agent, on its local socket, every ``install_poll`` seconds. Each step ends with the
state label written and an Event on the Node; a failure with ``upgrade-failed`` and a
Warning saying why.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from ...errors import ConflictError, HostagentError, UnavailableError
from ..kubeerror import KubeError
from . import gpupods, slots as slotlib
from . import upgradeplan as plan
from .events import NORMAL, WARNING
from .evict import Evictor, Refused, started, started_patch
from .keys import DRIVER_CONFIGMAP, EVICTION_STARTED, UPGRADE_ADMITTED, UPGRADE_STATE, UPGRADE_VERSION
from .watcher import Collection, Follower

__all__ = ["DriverUpgrade", "WHY", "REASON", "FAILED_REASON", "HALTED_REASON", "CONFIG_REASON"]

log = logging.getLogger("hostagent.plugins")

WHY = "driver-upgrade"                      # its cordon's reason (hostagent.io/cordoned-by)
REASON = "GPUDriverUpgrade"                 # the GPU operator's reason for each step
FAILED_REASON = plan.FAILED_EVENT
HALTED_REASON = "GPUDriverUpgradeHalted"
CONFIG_REASON = "GPUDriverUpgradeConfigInvalid"
PASS_STEPS = 32                             # steps in one pass at most (a walk has fewer)


class DriverUpgrade:
    def __init__(self, ctx):
        self.ctx = ctx
        options, api = ctx.options, ctx.api
        self.configmap = Follower(f"ConfigMap {options.namespace}/{DRIVER_CONFIGMAP}",
                                  lambda: api.get_configmap(options.namespace, DRIVER_CONFIGMAP),
                                  lambda rv: api.watch_configmap(options.namespace, DRIVER_CONFIGMAP, rv),
                                  self._configmap_changed, options.backoff, absent_ok=True)
        self.leases = Collection(f"the slot Leases of {options.namespace}",
                                 lambda: api.list_leases(options.namespace, slotlib.LABELS),
                                 lambda rv: api.watch_leases(options.namespace, slotlib.LABELS, rv),
                                 self._leases_changed, options.backoff)
        self.slots = slotlib.Slots(api, options.namespace, options.node, self.leases, options.upgrade_lease,
                                   wake=self.wake)
        self.known = False                  # the ConfigMap was read (or found absent) once
        self.last: plan.Step | None = None  # the last step, for the status line
        self._said: dict[str, str] = {}     # the Warning last recorded, by reason
        self._wake = threading.Event()
        self._timeout: float | None = None
        self._delay = options.backoff[0]
        self._thread: threading.Thread | None = None

    # ---- feeding ------------------------------------------------------------------------

    def _configmap_changed(self, configmap) -> None:
        self.known = True
        self.wake()

    def _leases_changed(self, items) -> None:
        self.slots.observed.see(items)
        self.wake()

    def wake(self, *_ignored) -> None:
        self._wake.set()

    def start(self) -> None:
        self.configmap.start()
        self.leases.start()
        self._thread = threading.Thread(target=self.run, name="driver-upgrade", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.configmap.stop()
        self.leases.stop()
        self.slots.stop()
        self.wake()

    def run(self) -> None:
        stop = self.ctx.stop
        while not stop.is_set():
            self._wake.wait(self._timeout)
            self._wake.clear()
            if stop.is_set():
                return
            self._timeout = None
            try:
                self._pass()
                self._delay = self.ctx.options.backoff[0]
            except (KubeError, HostagentError) as e:
                log.warning("driver upgrade: %s; trying again in %g s", e.message, self._delay)
                self._timeout, self._delay = self._delay, min(self._delay * 2, self.ctx.options.backoff[1])
            except Exception:                # a bug: said, and tried again later, never a dead thread
                log.exception("driver upgrade: a pass failed")
                self._timeout = self.ctx.options.backoff[1]

    # ---- what the step depends on ------------------------------------------------------------

    def wanted(self) -> tuple[plan.Desired | None, str | None]:
        return plan.desired(self.configmap.current)

    def facts(self, want: plan.Desired | None):
        node = self.ctx.writer.node
        facts = plan.NodeFacts.of(node)
        view = self.ctx.link.view
        job = None
        if facts.state == plan.POD_RESTART_REQUIRED and view.connected:
            try:
                job = self.ctx.client().driver_install()
            except UnavailableError as e:
                view = replace(view, connected=False, error=e.message)
        agent = plan.AgentFacts.of(view.connected, view.node, job)
        items, me = self.slots.items, self.ctx.options.node
        slot = plan.SlotFacts(slotlib.held_by(items, me), bool(slotlib.my_marks(items, me)),
                              slotlib.halted(items, want.version, me) if want else None)
        return facts, agent, slot

    def _pass(self) -> None:
        if self.ctx.writer.node is None or not self.known or not self.leases.listed:
            return
        self.slots.resume()                  # a slot held from before a restart is renewed again
        want, problem = self.wanted()
        self._say(CONFIG_REASON, problem)
        for _ in range(PASS_STEPS):
            node, agent, slot = self.facts(want)
            step = plan.next_step(want, node, agent, slot)
            self.last = step
            self._say(HALTED_REASON, step.why[len("the rollout is halted: "):]
                      if step.why.startswith("the rollout is halted") else None)
            if step.do == plan.WAIT:
                log.debug("driver upgrade waits: %s", step.why)
                return
            if step.do == plan.AWAIT:
                self._timeout = self.ctx.options.install_poll
                return
            log.log(logging.DEBUG if step.do == plan.ACQUIRE else logging.INFO, "driver upgrade: %s%s%s", step.do,
                    f" -> {step.state}" if step.state else "", f" ({step.why})" if step.why else "")
            if getattr(self, "_" + step.do)(step, want, node) is False:
                return
            if self.ctx.stop.is_set():
                return
        log.warning("driver upgrade: %d steps in one pass; waiting for a change", PASS_STEPS)

    def _say(self, reason: str, message: str | None) -> None:
        """A Warning once per distinct message (a halt, a bad ConfigMap)."""
        if message and self._said.get(reason) != message:
            self.ctx.recorder.record(WARNING, reason, message)
        self._said[reason] = message or ""

    # ---- the Node ---------------------------------------------------------------------------

    def _write(self, state: str | None, version: str | None, *, admitted: bool | None = None,
               evicting: bool | None = None) -> None:
        """The state label and the walk's annotations: its version, when it took its slot
        (``admitted``), when its evictions began (``evicting``); True: now, False: gone."""
        labels = {UPGRADE_STATE: state} if state else {}
        notes = {UPGRADE_VERSION: version} if version else {}
        for key, now in ((UPGRADE_ADMITTED, admitted), (EVICTION_STARTED.format(WHY), evicting)):
            if now is not None:
                notes[key] = f"{time.time():.3f}" if now else None

        def change(node):
            meta = node.get("metadata") or {}
            have_labels, have_notes = meta.get("labels") or {}, meta.get("annotations") or {}
            patch = {}
            if any(have_labels.get(k) != v for k, v in labels.items()):
                patch["labels"] = labels
            if any(have_notes.get(k) != v for k, v in notes.items()):
                patch["annotations"] = notes
            return {"metadata": patch} if patch else None
        self.ctx.writer.update(change, f"setting {UPGRADE_STATE}={state} on Node {self.ctx.options.node}")

    def _event(self, state: str, message: str) -> None:
        self.ctx.recorder.record(NORMAL, REASON, f"{state}: {message}")

    # ---- the steps (upgradeplan names them) --------------------------------------------------

    def _mark(self, step, want, node) -> None:
        self._write(step.state, step.version)
        self._event(step.state, step.why or f"the driver {step.version}")

    def _acquire(self, step, want, node):
        wanted = max(want.max_parallel if want else 0, 1 if node.state in plan.WALK else 0)
        name = self.slots.acquire(wanted)
        if name is None:
            expiry = self.slots.wait_for_slot(wanted)
            self._timeout = None if expiry is None else expiry + 0.05
            log.debug("driver upgrade: no free slot of %d; waiting", wanted)
            return False
        log.info("driver upgrade: slot %s taken", name)
        return None

    def _admit(self, step, want, node) -> None:
        self._write(step.state, step.version, admitted=True)
        self._event(step.state, f"slot {self.slots.held()} taken for the driver {step.version}; cordoning the node")

    def _cordon(self, step, want, node) -> None:
        if self.ctx.cordon.cordon(WHY) or self.ctx.cordon.holds(WHY):
            why = "the node is cordoned for the upgrade"
        else:
            why = "the node was cordoned already by someone else: it stays cordoned after the upgrade"
        self._write(step.state, step.version, evicting=True)
        self._event(step.state, f"{why}; evicting its GPU pods")

    def _evict(self, step, want, node):
        """Evict the GPU pods, retrying a budget's 429 until ``podDeletionTimeoutSeconds``
        after the evictions began (the Node says when: a restart goes on with the time left),
        then wait for them to go."""
        want = want or plan.Desired(step.version)
        api, me = self.ctx.api, self.ctx.options.node
        began = started(self.ctx.writer.node, WHY)
        if began is None:                    # the state set by hand: they begin now
            began = time.time()
            self.ctx.writer.update(lambda n: started_patch(n, WHY, began), "recording when the evictions began")
        left = began + want.pod_deletion_timeout - time.time()
        pods = api.node_pods(me)
        claims = {}
        for ref in sorted({c for p in gpupods.candidates(pods) for c in gpupods.claim_names(p)}):
            try:
                claims[ref] = api.get_claim(*ref)
            except KubeError as e:
                claims[ref] = {} if e.status == 404 else None       # gone: no GPU; unreadable: taken for one
        targets = gpupods.gpu_pods(pods, claims)
        deadline = time.monotonic() + left
        evictor = Evictor(api, timeout=want.pod_deletion_timeout, stop=self.ctx.stop)
        deleted = []
        try:
            evictor.evict(targets, left=left)
        except Refused as e:
            if self.ctx.stop.is_set():       # stopping is no failure: the next start goes on
                return False
            if not want.pod_deletion_force:
                return self._fail(plan.Step(plan.FAIL, version=step.version, why=f"GPU pods were not evicted within "
                                            f"{want.pod_deletion_timeout} s: {e.message} (podDeletionForce is "
                                            "false)"), want, node)
            for key in sorted(e.pods):
                namespace, _, name = key.partition("/")
                try:
                    api.delete_pod(namespace, name)
                except KubeError as d:
                    if d.status != 404:
                        return self._fail(plan.Step(plan.FAIL, version=step.version,
                                                    why=f"pod {key} was not deleted: {d.message}"), want, node)
                deleted.append(key)
        if self.ctx.stop.is_set():
            return False
        still = self._gone(targets, deadline)
        if self.ctx.stop.is_set():
            return False
        if still:
            return self._fail(plan.Step(plan.FAIL, version=step.version, why=f"GPU pods evicted but still there after "
                                        f"{want.pod_deletion_timeout} s: {', '.join(still)}"), want, node)
        self._write(step.state, step.version, evicting=False)
        moved = [f"{ns}/{name}" for ns, name in targets if f"{ns}/{name}" not in deleted]
        said = (f"evicted {', '.join(moved)}" if moved else "no GPU pod to move") + \
               (f"; deleted {', '.join(deleted)} (podDeletionForce)" if deleted else "")
        self._event(step.state, f"{said}; installing the driver {step.version} through the agent")

    def _gone(self, targets, deadline: float) -> list[str]:
        """The evicted pods still on the node at ``deadline`` (a pod's grace period runs)."""
        wanted = {f"{ns}/{name}" for ns, name in targets}
        while wanted:
            present = {f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
                       for p in self.ctx.api.node_pods(self.ctx.options.node)}
            wanted &= present
            if not wanted or time.monotonic() >= deadline or self.ctx.stop.wait(1.0):
                break
        return sorted(wanted)

    def _install(self, step, want, node):
        try:
            answer = self.ctx.client().install_driver(step.version, force=True)
        except ConflictError as e:
            if e.code == "driver_install_unavailable":
                return self._fail(plan.Step(plan.FAIL, version=step.version, why=e.message), want, node)
            log.warning("driver upgrade: the agent cannot install %s now: %s", step.version, e.message)
            self._timeout = 5.0
            return False
        if answer.get("started"):
            log.info("driver upgrade: the agent installs %s%s", step.version, f" ({step.why})" if step.why else "")
        self._timeout = self.ctx.options.install_poll
        return False

    def _validate(self, step, want, node):
        with self.ctx.long_client() as client:          # a verification reads every GPU: no time limit
            return self._validated(client, step, want, node)

    def _validated(self, client, step, want, node):
        """The agent's gate verified the new driver, and its inventory (the CDI spec) was read
        with it: after an install the agent does both as it leaves maintenance, so they are
        asked for again only when that is not what the agent says."""
        driver = client.driver()
        fresh = driver["ready"] and driver["version"] == step.version and \
            (driver.get("checked_at") or 0) >= (node.admitted or float("inf"))
        if not fresh and driver["state"] not in ("verifying", "maintenance"):
            driver = client.verify_driver()
        if driver["state"] in ("verifying", "maintenance"):
            self._timeout = self.ctx.options.install_poll
            return False
        if not driver["ready"]:
            return self._fail(plan.Step(plan.FAIL, version=step.version,
                                        why=f"the driver {step.version} does not verify: {driver['reason']}"), want, node)
        if driver["version"] != step.version:
            return self._fail(plan.Step(plan.FAIL, version=step.version, why=f"the agent verifies the driver "
                                        f"{driver['version']}, not {step.version}"), want, node)
        seen = client.node()
        if seen.get("driver_version") != step.version:
            client.refresh()
            seen = client.node()
        if seen.get("driver_version") != step.version:
            return self._fail(plan.Step(plan.FAIL, version=step.version, why=f"the agent's inventory reads the driver "
                                        f"{seen.get('driver_version')}, not {step.version}"), want, node)
        cdi = seen.get("cdi") or {}
        self._write(step.state, step.version)
        self._event(step.state, f"the driver {step.version} verifies; the CDI spec {cdi.get('spec')} is refreshed "
                                f"({cdi.get('devices', 0)} devices); uncordoning")

    def _uncordon(self, step, want, node) -> None:
        self.ctx.cordon.uncordon(WHY)
        others = self.ctx.cordon.holders()
        self._write(step.state, step.version, admitted=False)
        self._event(step.state, f"the driver {step.version} is in place; the node "
                    + ("is uncordoned" if others is None else f"stays cordoned (for {', '.join(others)})" if others
                       else "stays cordoned (not by the upgrade)"))

    def _fail(self, step, want, node):
        where = node.state or "upgrade-required"
        what = f"the upgrade to the driver {step.version}" if step.version else "the driver upgrade"
        message = f"{what} failed at {where}: {step.why}; the node stays cordoned"
        self.ctx.recorder.record(WARNING, FAILED_REASON, message)       # the Event first: the label points at it
        self._write(plan.UPGRADE_FAILED, step.version, evicting=False)
        self.slots.release({"node": self.ctx.options.node, "version": step.version, "reason": step.why})
        return False

    def _release(self, step, want, node) -> None:
        mark = {"node": self.ctx.options.node, "version": step.version, "reason": step.why} if step.why else None
        if self.slots.release(mark):
            log.info("driver upgrade: slot released%s", " with this node's failure mark" if mark else "")

    def _clear(self, step, want, node) -> None:
        self.slots.clear_marks()
        log.info("driver upgrade: this node's failure mark removed: the rollout may go on")

    # ---- status -----------------------------------------------------------------------------

    def status(self) -> str | None:
        step = self.last
        if step is None or (step.do == plan.WAIT and step.why.startswith("no ConfigMap")):
            return None
        return f"driver upgrade: {step.why or step.do}"
