"""Admission to a driver upgrade: one of ``maxParallelUpgrades`` slots, each a Lease
(coordination.k8s.io/v1) ``hostagent-driver-upgrade-<i>`` in the controller's namespace,
held in the node's name and renewed for its whole upgrade. The rules are client-go's for a
leader election Lease:

- A slot is free when its Lease does not exist (it is created), has no holder (released),
  or expired: unchanged for its ``leaseDurationSeconds`` since this controller first saw
  that version of it. Only this controller's clock counts, never another node's
  ``renewTime``, so clock skew between nodes does not matter.
- Every write carries the Lease's resourceVersion. A 409 means another node wrote first;
  the watch brings what it wrote, and the node tries again from there.
- A node whose upgrade failed releases its slot with a mark, the annotation
  ``hostagent.io/driver-upgrade.failed`` (JSON: node, version, reason). While a mark names
  a version, no node starts an upgrade to it: the rollout is halted until that node's
  controller removes its mark (the node retried, skipped, or fixed).

The pure functions judge Leases given as plain dicts; ``Slots`` writes them.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from ..kubeerror import KubeError

__all__ = ["PREFIX", "LABELS", "FAILED_MARK", "slot_name", "holder", "held_by", "mark_of", "halted", "my_marks",
           "Observed", "choose", "acquired", "renewed", "released", "unmarked", "Slots", "micro_time"]

log = logging.getLogger("hostagent.plugins")

PREFIX = "hostagent-driver-upgrade-"
LABELS = {"app.kubernetes.io/name": "hostagent", "app.kubernetes.io/component": "driver-upgrade"}
FAILED_MARK = "hostagent.io/driver-upgrade.failed"


def slot_name(i: int) -> str:
    return f"{PREFIX}{i}"


def micro_time(t: float) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def holder(lease: dict | None) -> str | None:
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


def held_by(leases: dict, me: str) -> str | None:
    """The slot ``me`` holds (whatever ``maxParallelUpgrades`` is now), or None."""
    return next((name for name, lease in sorted(leases.items()) if holder(lease) == me), None)


def mark_of(lease: dict) -> dict | None:
    raw = ((lease.get("metadata") or {}).get("annotations") or {}).get(FAILED_MARK)
    try:
        mark = json.loads(raw) if raw else None
    except ValueError:
        return None
    return mark if isinstance(mark, dict) and mark.get("node") else None


def halted(leases: dict, version: str, me: str) -> str | None:
    """Why the rollout to ``version`` is halted (another node failed it), or None."""
    for name, lease in sorted(leases.items()):
        mark = mark_of(lease)
        if mark and mark["node"] != me and mark.get("version") == version:
            return f"{mark['node']} failed to upgrade to {version}: {mark.get('reason') or 'no reason given'}"
    return None


def my_marks(leases: dict, me: str) -> list[str]:
    return [name for name, lease in sorted(leases.items()) if (mark_of(lease) or {}).get("node") == me]


class Observed:
    """When this controller first saw each Lease at its resourceVersion (its own clock)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._seen: dict[str, tuple[str, float]] = {}

    def see(self, leases: dict) -> None:
        now = self.clock()
        for name, lease in leases.items():
            version = lease["metadata"].get("resourceVersion", "")
            if self._seen.get(name, ("", 0.0))[0] != version:
                self._seen[name] = (version, now)

    def expires(self, name: str, lease: dict) -> float:
        """When (on the clock) the Lease expires unless it changes."""
        self.see({name: lease})
        duration = (lease.get("spec") or {}).get("leaseDurationSeconds") or 0
        return self._seen[name][1] + duration


def choose(leases: dict, max_parallel: int, observed: Observed) -> tuple[str, dict | None] | None:
    """The first free slot below ``max_parallel``: (its name, its Lease or None to create)."""
    now = observed.clock()
    for i in range(max_parallel):
        name = slot_name(i)
        lease = leases.get(name)
        if lease is None or holder(lease) is None or observed.expires(name, lease) <= now:
            return name, lease
    return None


def next_expiry(leases: dict, max_parallel: int, observed: Observed) -> float | None:
    """Seconds until the first held slot below ``max_parallel`` would expire."""
    times = [observed.expires(slot_name(i), leases[slot_name(i)]) for i in range(max_parallel)
             if holder(leases.get(slot_name(i)))]
    return max(0.0, min(times) - observed.clock()) if times else None


def acquired(lease: dict | None, name: str, namespace: str, me: str, duration: int, now: float) -> dict:
    """The Lease ``me`` holds from ``now`` (a new one when ``lease`` is None); the rest of
    the old one (its marks) is kept."""
    old = lease or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": namespace, "labels": dict(LABELS)}, "spec": {}}
    spec = old.get("spec") or {}
    transitions = (spec.get("leaseTransitions") or 0) + (1 if lease is not None and holder(lease) != me else 0)
    return {**old, "spec": {**spec, "holderIdentity": me, "leaseDurationSeconds": duration,
                            "acquireTime": micro_time(now), "renewTime": micro_time(now),
                            "leaseTransitions": transitions}}


def renewed(lease: dict, now: float) -> dict:
    return {**lease, "spec": {**lease["spec"], "renewTime": micro_time(now)}}


def released(lease: dict, mark: dict | None = None) -> dict:
    """The Lease without a holder (and with ``mark``: {node, version, reason})."""
    spec = {k: v for k, v in (lease.get("spec") or {}).items() if k not in ("holderIdentity", "acquireTime",
                                                                              "renewTime")}
    out = {**lease, "spec": spec}
    if mark is not None:
        meta = out["metadata"]
        out["metadata"] = {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                   FAILED_MARK: json.dumps(mark, sort_keys=True)}}
    return out


def unmarked(lease: dict) -> dict:
    meta = lease["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != FAILED_MARK}
    out_meta = {k: v for k, v in meta.items() if k != "annotations"}
    if annotations:
        out_meta["annotations"] = annotations
    return {**lease, "metadata": out_meta}


class Slots:
    """The node's slot: taken, renewed every third of its duration on a thread of its own
    (a long step, an eviction's retries, never lets it lapse), released. ``leases`` is the
    watched ``Collection`` of the slot Leases; each write's answer is put into it at once."""

    def __init__(self, api, namespace: str, me: str, leases, duration: int = 60, wake=lambda: None,
                 clock=time.monotonic, wall=time.time):
        self.api = api
        self.namespace = namespace
        self.me = me
        self.leases = leases
        self.duration = duration
        self.wake = wake                   # the upgrade's wake-up: a renewal found the slot lost
        self.observed = Observed(clock)
        self.wall = wall
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._renewing = False             # a renewer runs (set and cleared under the lock)

    @property
    def items(self) -> dict:
        return self.leases.items

    def held(self) -> str | None:
        return held_by(self.items, self.me)

    def _mine(self) -> tuple[str | None, dict | None]:
        """The slot this node holds and its Lease, from one look at the Leases: the watch
        replaces them meanwhile, and a second look may find the Lease another node took."""
        items = self.items
        name = held_by(items, self.me)
        return name, items.get(name) if name else None

    def _write(self, body: dict, create: bool = False) -> dict | None:
        """Create or replace; None when another node wrote first (409)."""
        try:
            out = self.api.create_lease(body) if create else self.api.replace_lease(body)
        except KubeError as e:
            if e.status == 409:
                log.debug("Lease %s changed meanwhile", body["metadata"]["name"])
                return None
            raise
        self.leases.seen(out)
        return out

    def acquire(self, max_parallel: int) -> str | None:
        """Take a free slot: its name, or None (none free now, or another node was first)."""
        with self._lock:
            if self.held():
                return self.held()
            free = choose(self.items, max_parallel, self.observed)
            if free is None:
                return None
            name, lease = free
            body = acquired(lease, name, self.namespace, self.me, self.duration, self.wall())
            if self._write(body, create=lease is None) is None:
                return None
            if lease is not None and holder(lease):
                log.warning("Lease %s of %s expired: taken over", name, holder(lease))
            self._start_renewing()
            return name

    def wait_for_slot(self, max_parallel: int) -> float | None:
        """Seconds until a busy slot would expire (None: none is held)."""
        return next_expiry(self.items, max_parallel, self.observed)

    def release(self, mark: dict | None = None) -> bool:
        """Release the slot held (with a failure ``mark``); True when one was."""
        with self._lock:
            for _ in range(5):
                name, lease = self._mine()
                if name is None:
                    return False
                if self._write(released(lease, mark)) is not None:
                    return True
                time.sleep(0.2)             # the watch brings the other write
            raise KubeError(f"releasing Lease {self.namespace}/{self.held()}: it kept changing", status=409)

    def clear_marks(self) -> None:
        """Remove this node's failure marks (its rollout may go on)."""
        with self._lock:
            items = self.items
            for name in my_marks(items, self.me):
                self._write(unmarked(items[name]))

    # ---- renewal ---------------------------------------------------------------------

    def _start_renewing(self) -> None:
        """Under the lock: a renewer, unless one runs (it stops only under the lock too)."""
        if not self._renewing:
            self._renewing = True
            self._renewer = threading.Thread(target=self._renew, name="driver-upgrade-lease", daemon=True)
            self._renewer.start()

    def resume(self) -> None:
        """At start: a slot this node holds (its walk was under way) is renewed again."""
        with self._lock:
            if self.held():
                self._start_renewing()

    def stop(self) -> None:
        self._stop.set()

    def _renew(self) -> None:
        delay, last = self.duration / 3, None
        while not self._stop.wait(delay):
            with self._lock:
                name, lease = self._mine()
                if name is None:             # released; or taken over, when it lapsed unrenewed
                    taker = holder(self.items.get(last)) if last else None
                    if taker not in (None, self.me):
                        log.warning("Lease %s was taken over by %s while this node's upgrade ran", last, taker)
                        self.wake()              # its walk takes a slot again before it goes on
                    self._renewing = False
                    return
                last = name
                try:
                    ok = self._write(renewed(lease, self.wall())) is not None
                except KubeError as e:
                    log.warning("Lease %s not renewed: %s", name, e.message)
                    ok = False
            delay = self.duration / 3 if ok else 1.0
        with self._lock:
            self._renewing = False
