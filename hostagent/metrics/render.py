"""The exposition text of the DCGM-compatible families, from a sample and label strings.

Written by hand rather than through prometheus_client's generator, which appends
``_total`` to every counter's HELP and TYPE lines: dcgm-exporter's counters
(``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) carry no suffix, and dashboards query them by
that name. The text is Prometheus text format 0.0.4, which prometheus_client's parser reads.
"""

from __future__ import annotations

from typing import Mapping

from .families import (GPU_FAMILIES, HEALTH_FAMILIES, INSTANCE_FAMILIES, INSTANCE_PROF_FAMILIES, PROF_FAMILIES,
                       XID_FAMILY)
from .labels import format_labels, instance_key
from .xids import xid_name

__all__ = ["members", "label_strings", "last_xids", "render_dcgm", "render_health"]


def members(inventory) -> dict:
    """Series key (GPU index, or (GPU, GI)) -> UUIDs of the devices it stands for."""
    out = {}
    for gpu in inventory.gpus:
        out[gpu.index] = (gpu.uuid,)
        for gi in (gpu.mig.gpu_instances if gpu.mig_enabled else ()):
            out[instance_key(gpu.index, gi.id)] = tuple(d.uuid for d in gpu.mig.devices if d.gi == gi.id)
    return out


def _extra(uuids, extra: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str]]:
    merged: dict[str, list[str]] = {}
    for uuid in uuids:
        for k, v in (extra.get(uuid) or {}).items():
            if v not in merged.setdefault(k, []):
                merged[k].append(v)
    return [(k, ",".join(v)) for k, v in sorted(merged.items())]


def label_strings(base: dict, member_map: dict, extra: Mapping[str, Mapping[str, str]]) -> dict:
    return {key: format_labels(pairs + tuple(_extra(member_map.get(key, ()), extra)))
            for key, pairs in base.items()}


def last_xids(state, member_map: dict) -> dict:
    """Series key -> the most recent XID among its devices (0: none), as DCGM reports it."""
    out = {}
    for key, uuids in member_map.items():
        latest = None
        for uuid in uuids:
            dev = state.get(uuid) if state is not None else None
            if dev is not None and dev.last_xid is not None and (
                    latest is None or (dev.last_event_at or 0) > (latest.last_event_at or 0)):
                latest = dev
        out[key] = latest.last_xid if latest else 0
    return out


def _num(value, digits: int = 3) -> str:
    if isinstance(value, float):
        return repr(round(value, digits))
    return str(int(value))


def _family(lines: list, fam, body: list) -> None:
    if body:
        lines.append(f"# HELP {fam.name} {fam.help}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        lines.extend(body)


def render_dcgm(snapshot, strings: dict, xids: dict) -> str:
    lines: list[str] = []
    gpus = [s for s in (snapshot.gpus if snapshot else ()) if not s.lost and s.index in strings]
    instances = [s for s in (snapshot.instances if snapshot else ())
                 if instance_key(s.gpu, s.gi) in strings]
    for fam in GPU_FAMILIES + PROF_FAMILIES:
        body = []
        for s in gpus:
            value = fam.value(s)
            if value is not None:
                body.append(f"{fam.name}{strings[s.index]} {_num(value, fam.digits)}")
        if fam in INSTANCE_FAMILIES or fam in INSTANCE_PROF_FAMILIES:
            for s in instances:
                value = fam.value(s)
                if value is not None:
                    body.append(f"{fam.name}{strings[instance_key(s.gpu, s.gi)]} {_num(value, fam.digits)}")
        _family(lines, fam, body)
    _family(lines, XID_FAMILY, [f"{XID_FAMILY.name}{_with_xid(strings[k], v)} {v}" for k, v in xids.items()
                                if k in strings])
    return "\n".join(lines) + "\n" if lines else ""


def _with_xid(labels: str, code: int) -> str:
    """The series' labels plus ``err_code`` and ``err_msg`` last, as dcgm-exporter adds them
    (its attributes follow every other label)."""
    xid = format_labels((("err_code", str(code)), ("err_msg", xid_name(code))))
    return labels[:-1] + "," + xid[1:] if labels not in ("", "{}") else xid


def render_health(state, hostname: str, extra: Mapping[str, Mapping[str, str]]) -> str:
    if state is None or not state.devices:
        return ""
    labels = {}
    for dev in state.devices.values():
        pairs = (("gpu", str(dev.gpu)), ("UUID", dev.key), ("name", dev.name), ("Hostname", hostname))
        labels[dev.key] = format_labels(pairs + tuple(_extra((dev.key,), extra)))
    lines: list[str] = []
    healthy, monitored = HEALTH_FAMILIES
    _family(lines, healthy, [f"{healthy.name}{labels[d.key]} {int(d.healthy)}" for d in state.devices.values()])
    _family(lines, monitored, [f"{monitored.name}{labels[d.key]} {int(d.monitored)}"
                               for d in state.devices.values()])
    return "\n".join(lines) + "\n"
