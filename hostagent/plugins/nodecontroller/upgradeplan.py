"""Driver upgrades across the fleet, pure: the node's next step on NVIDIA's label
``nvidia.com/gpu-driver-upgrade-state``. It is computed from what the fleet wants (the
ConfigMap ``hostagent-driver``), the Node's label and annotations, what the agent says of
its driver and of the install it runs, and the node's slot (``slots``):

    "" / upgrade-done ── the version differs ──> upgrade-required ── a slot ──> cordon-required
    cordon-required ── cordoned ──> pod-deletion-required ── GPU pods evicted ──> pod-restart-required
    pod-restart-required ── installed through the agent ──> validation-required
    validation-required ── verified, CDI refreshed ──> uncordon-required ── own cordon lifted ──> upgrade-done
    any step ── fails ──> upgrade-failed (still cordoned, the slot released with a mark, an Event says why)

``pod-restart-required`` is NVIDIA's name for the step that replaces the driver (its driver
pod restarts); here the agent installs it. Every decision is made again from what is there
now, so a restart of anything at any step goes on from where it was. The agent's install
report and its verified version decide together with the label, so a node is never
installed twice: a walk's install is the agent's report of the walk's version started after
the node took its slot (``admitted``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...suggest import unknown
from .keys import UPGRADE_ADMITTED, UPGRADE_SKIP, UPGRADE_STATE, UPGRADE_VERSION

__all__ = ["Desired", "desired", "NodeFacts", "AgentFacts", "SlotFacts", "Step", "next_step", "walk_install",
           "UPGRADE_REQUIRED", "CORDON_REQUIRED", "POD_DELETION_REQUIRED", "POD_RESTART_REQUIRED",
           "VALIDATION_REQUIRED", "UNCORDON_REQUIRED", "UPGRADE_DONE", "UPGRADE_FAILED", "WALK",
           "WAIT", "AWAIT", "MARK", "ACQUIRE", "ADMIT", "CORDON", "EVICT", "INSTALL", "VALIDATE", "UNCORDON",
           "FAIL", "RELEASE", "CLEAR"]

UPGRADE_REQUIRED, CORDON_REQUIRED, POD_DELETION_REQUIRED = "upgrade-required", "cordon-required", "pod-deletion-required"
POD_RESTART_REQUIRED, VALIDATION_REQUIRED, UNCORDON_REQUIRED = ("pod-restart-required", "validation-required",
                                                                "uncordon-required")
UPGRADE_DONE, UPGRADE_FAILED = "upgrade-done", "upgrade-failed"
WALK = (CORDON_REQUIRED, POD_DELETION_REQUIRED, POD_RESTART_REQUIRED, VALIDATION_REQUIRED, UNCORDON_REQUIRED)

# What a step does (its executor is upgrade.DriverUpgrade's method of the same name).
WAIT = "wait"          # nothing until something it reads changes (``why``: for what)
AWAIT = "await"        # the agent's install runs: ask it again shortly
MARK = "mark"          # write the state label (and the walk's version)
ACQUIRE = "acquire"    # take a free slot
ADMIT = "admit"        # the slot is held: cordon-required, the walk's start recorded
CORDON, EVICT, INSTALL, VALIDATE, UNCORDON = "cordon", "evict", "install", "validate", "uncordon"
FAIL = "fail"          # upgrade-failed, an Event saying ``why``, the slot released with a mark
RELEASE = "release"    # the slot goes (the walk is over; state upgrade-failed and a why: with the mark)
CLEAR = "clear"        # this node's failure mark goes (it no longer halts the rollout)

FAILED_EVENT = "GPUDriverUpgradeFailed"     # the Warning a failed walk leaves on the Node

VERSION = re.compile(r"[0-9]{3,4}\.[0-9]{1,3}(\.[0-9]{1,3})?")
KEYS = ("version", "maxParallelUpgrades", "podDeletionTimeoutSeconds", "podDeletionForce")
RUNNING = ("starting", "running")


@dataclass(frozen=True)
class Desired:
    """What the ConfigMap asks of the fleet."""
    version: str
    max_parallel: int = 1                  # 0: paused
    pod_deletion_timeout: int = 300        # seconds
    pod_deletion_force: bool = False       # delete the pods an eviction did not move in time


def _count(data: dict, key: str, default: int) -> int:
    raw = str(data.get(key, default)).strip()
    if not raw.isdigit():
        raise ValueError(f"{key} {raw!r} is not a whole number of 0 or more")
    return int(raw)


def desired(configmap: dict | None) -> tuple[Desired | None, str | None]:
    """(the fleet's wish, None), (None, why the ConfigMap cannot be used), or (None, None)
    without a ConfigMap."""
    if configmap is None:
        return None, None
    meta = configmap.get("metadata") or {}
    where = f"ConfigMap {meta.get('namespace')}/{meta.get('name')}"
    data = configmap.get("data") or {}
    try:
        extra = sorted(set(data) - set(KEYS))
        if extra:
            raise ValueError(unknown("key", extra[0], KEYS))
        version = str(data.get("version") or "").strip()
        if not version:
            raise ValueError("no version (a full driver version, such as 550.127.05)")
        if not VERSION.fullmatch(version):
            raise ValueError(f"version {version!r} is not a driver version (one like 550.127.05)")
        force = str(data.get("podDeletionForce", "false")).strip().lower()
        if force not in ("true", "false"):
            raise ValueError(f"podDeletionForce {data['podDeletionForce']!r} is not true or false")
        return Desired(version, _count(data, "maxParallelUpgrades", 1), _count(data, "podDeletionTimeoutSeconds", 300),
                       force == "true"), None
    except ValueError as e:
        return None, f"{where}: {e}"


@dataclass(frozen=True)
class NodeFacts:
    state: str = ""                  # the state label ("": none)
    skip: bool = False               # hostagent.io/driver.upgrade=skip
    version: str | None = None       # the version the walk is (or was last) for
    admitted: float | None = None    # when the walk took its slot (Unix time)

    @classmethod
    def of(cls, node: dict) -> "NodeFacts":
        meta = node.get("metadata") or {}
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        try:
            admitted = float(notes[UPGRADE_ADMITTED]) if notes.get(UPGRADE_ADMITTED) else None
        except ValueError:
            admitted = None
        return cls(labels.get(UPGRADE_STATE) or "", labels.get(UPGRADE_SKIP) == "skip",
                   notes.get(UPGRADE_VERSION) or None, admitted)


@dataclass(frozen=True)
class AgentFacts:
    connected: bool = False
    ready: bool = False              # its gate is open (the driver verifies)
    busy: bool = False               # verifying, or in maintenance (an install holds it)
    version: str | None = None       # the driver version it knows
    job: dict | None = None          # GET /v1/driver/install (None: not asked)

    @classmethod
    def of(cls, connected: bool, node: dict, job: dict | None = None) -> "AgentFacts":
        driver = (node or {}).get("driver") or {}
        return cls(connected, bool(driver.get("ready")), driver.get("state") in ("verifying", "maintenance"),
                   driver.get("version") or (node or {}).get("driver_version"), job)


@dataclass(frozen=True)
class SlotFacts:
    held: str | None = None          # the slot Lease this node holds
    mine_failed: bool = False        # a failure mark of this node is on a Lease
    halted: str | None = None        # another node failed the wanted version: why


@dataclass(frozen=True)
class Step:
    do: str
    state: str | None = None         # the state label once the step is done
    version: str | None = None       # the walk's version
    why: str = ""


def walk_install(node: NodeFacts, agent: AgentFacts) -> dict | None:
    """The agent's install of this walk: its version, started after the node took its slot."""
    job = agent.job
    if not job or job.get("version") != node.version or node.admitted is None:
        return None
    return job if (job.get("started_at") or 0) >= node.admitted else None


def next_step(want: Desired | None, node: NodeFacts, agent: AgentFacts, slot: SlotFacts) -> Step:
    if node.state in WALK:
        return _walking(want, node, agent, slot)
    failed_here = node.state == UPGRADE_FAILED and not node.skip and want is not None and node.version == want.version
    if slot.mine_failed and not failed_here:
        return Step(CLEAR)
    if slot.held and node.state == UPGRADE_FAILED:
        # A failed walk whose release did not happen (a restart, the API server away): the
        # slot goes with the mark that halts the rollout, as the failure would have left it.
        return Step(RELEASE, UPGRADE_FAILED, node.version,
                    why=f"see its Warning {FAILED_EVENT}" if failed_here else "")
    step = _resting(want, node, agent, slot)
    if slot.held and step.do not in (ADMIT, MARK):
        return Step(RELEASE)                 # a walk that ended before its slot was released
    return step


def _resting(want: Desired | None, node: NodeFacts, agent: AgentFacts, slot: SlotFacts) -> Step:
    if want is None:
        return Step(WAIT, why="no ConfigMap asks for a driver version")
    if node.skip:
        return Step(WAIT, why=f"left out ({UPGRADE_SKIP}=skip)")
    if not agent.connected or agent.version is None:
        return Step(WAIT, why="the agent's driver is not known yet")
    if agent.version == want.version:
        if not agent.ready:
            return Step(WAIT, why=f"the driver {want.version} is in place but does not verify")
        if node.state == UPGRADE_FAILED:          # fixed by hand: the controller's cordon is lifted
            return Step(UNCORDON, UPGRADE_DONE, want.version, why=f"the driver {want.version} is in place")
        if node.state != UPGRADE_DONE:
            return Step(MARK, UPGRADE_DONE, want.version, why=f"the driver {want.version} is in place")
        return Step(WAIT, why=f"the driver {want.version} is in place")
    if node.state == UPGRADE_FAILED and node.version == want.version:
        return Step(WAIT, why=f"the upgrade to {want.version} failed: the admin decides")
    if node.state != UPGRADE_REQUIRED or node.version != want.version:
        return Step(MARK, UPGRADE_REQUIRED, want.version, why=f"the driver {agent.version} is to be {want.version}")
    if slot.held:
        return Step(ADMIT, CORDON_REQUIRED, want.version, why=f"slot {slot.held} held")
    if want.max_parallel == 0:
        return Step(WAIT, why="the rollout is paused (maxParallelUpgrades is 0)")
    if slot.halted:
        return Step(WAIT, why=f"the rollout is halted: {slot.halted}")
    return Step(ACQUIRE, why="a free slot")


def _walking(want: Desired | None, node: NodeFacts, agent: AgentFacts, slot: SlotFacts) -> Step:
    state, version = node.state, node.version
    if not slot.held:          # its slot was lost (the API server away too long): a slot again, whatever else holds
        return Step(ACQUIRE, why="its slot again, to go on")
    if version is None:
        return Step(FAIL, why=f"the node is at {state} without {UPGRADE_VERSION}: nothing says which version")
    job = walk_install(node, agent)
    running = job is not None and job["state"] in RUNNING
    if want is not None and want.version != version and not running and state != UNCORDON_REQUIRED:
        return Step(MARK, POD_RESTART_REQUIRED if state == VALIDATION_REQUIRED else state, want.version,
                    why=f"the fleet's version is now {want.version}")
    if state == CORDON_REQUIRED:
        return Step(CORDON, POD_DELETION_REQUIRED, version)
    if state == POD_DELETION_REQUIRED:
        return Step(EVICT, POD_RESTART_REQUIRED, version)
    if state == VALIDATION_REQUIRED:
        return Step(VALIDATE, UNCORDON_REQUIRED, version)
    if state == UNCORDON_REQUIRED:
        return Step(UNCORDON, UPGRADE_DONE, version)
    # pod-restart-required: the install through the agent
    if running:
        return Step(AWAIT, why=job.get("progress") or "the installer starts")
    if not agent.connected or agent.busy:
        return Step(WAIT, why="the agent (it verifies the driver, or is away)")
    if (agent.ready and agent.version == version) or (job is not None and job["state"] == "succeeded"):
        return Step(MARK, VALIDATION_REQUIRED, version, why=f"the driver {version} is installed")
    if job is not None and job["state"] == "rolled-back":
        return Step(FAIL, version=version, why=f"the driver {version} did not work and was rolled back to "
                                               f"{(job.get('outcome') or {}).get('previous') or 'the one before'}: "
                                               f"{job.get('error')}")
    if job is not None and job["state"] == "failed":
        return Step(FAIL, version=version, why=f"the driver {version} was not installed: {job.get('error')}")
    return Step(INSTALL, version=version, why="resumed" if job is not None else "")
