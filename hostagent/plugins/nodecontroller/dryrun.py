"""``node-controller --dry-run``: what one pass would do now, from the Node as the API server
has it and the agent's answers, in lines; nothing is written anywhere."""

from __future__ import annotations

import time

from ...client import Client
from ...errors import HostagentError
from . import healthplan, migplan, sharingplan
from .configs import config_names, read_sharing_config
from .events import timestamp
from .keys import CONDITION, MIG_STATE, SHARING_STATE

__all__ = ["dry_run"]


def _mig(labels: dict, options, mig_file, client) -> list[str]:
    name = migplan.wanted(labels)
    if name is None:
        return ["MIG: no nvidia.com/mig.config label: nothing to do"]
    step = migplan.check_name(name, mig_file)
    if step is None:
        try:
            step = migplan.after_plan(name, client.mig_plan(name, spec=mig_file.document()), options.on_busy)
        except HostagentError as e:
            step = migplan.refused(name, e.message)
    out = [f"MIG: {MIG_STATE}={step.state}" + (" and apply" if step.apply else "")
           + (" after evicting the pods in the way" if step.evict else "")]
    return out + ([f"MIG: Event {step.event[0]} {step.event[1]}: {step.event[2]}"] if step.event else [])


def _sharing(labels: dict, options, client) -> list[str]:
    if options.sharing_configs is None:
        return ["sharing: no --sharing-configs: left alone"]
    names = config_names(options.sharing_configs)
    choice = sharingplan.choose(labels, options.default_sharing_config, names, options.sharing_configs)
    if choice.problem:
        return [f"sharing: {SHARING_STATE}=failed: {choice.problem}"]
    document = None
    if choice.name is not None:
        config, problem = read_sharing_config(names[choice.name])
        if problem:
            return [f"sharing: {SHARING_STATE}=failed: {problem}"]
        document = None if config.empty else config.document
    current = (client.sharing().get("config") or {}).get("document")
    if sharingplan.in_place(current, document):
        return [f"sharing: config {choice.name!r} ({choice.why}) in place: {SHARING_STATE}=success"]
    plan = client.sharing_apply(document, dry_run=True)
    steps = [s.get("description") for s in (plan.get("plan") or {}).get("steps") or ()]
    return [f"sharing: apply config {choice.name!r} ({choice.why}): " + ("; ".join(steps) or "nothing to change")]


def _health(node: dict, client) -> list[str]:
    listing = client.devices()
    devices = {d["uuid"]: d for d in (*listing.get("gpus", ()), *listing.get("mig_devices", ()))}
    agent_node = client.node()
    previous = next((c for c in (node.get("status") or {}).get("conditions") or () if c.get("type") == CONDITION),
                    None)
    condition = healthplan.condition(healthplan.problems(devices, agent_node), previous, timestamp(time.time()))
    if condition is None:
        return [f"health: condition {CONDITION} as it is ({previous['status']})"]
    return [f"health: condition {CONDITION}={condition['status']}: {condition['message']}"]


def dry_run(options, api, mig_file) -> list[str]:
    node = api.get_node(options.node)
    labels = (node.get("metadata") or {}).get("labels") or {}
    with Client(socket_path=options.agent_socket, timeout=30) as client:
        return _mig(labels, options, mig_file, client) + _sharing(labels, options, client) + _health(node, client)
