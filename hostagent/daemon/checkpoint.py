"""The allocations checkpoint: ``<state_dir>/allocations.json``, written atomically and
durably after each change. Writing it is the commit point of an allocation: the transient
spec is written before it (so a crash in between leaves a spec the next start removes) and
removed after it (so a crash in between leaves a spec the next start removes too).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot
from .allocations import Allocation

__all__ = ["VERSION", "path", "read", "load", "save", "stray_temporaries"]

VERSION = 1
log = logging.getLogger("hostagent.daemon")


def path(host: HostRoot) -> Path:
    return host.state_dir / "allocations.json"


def read(host: HostRoot) -> list[Allocation]:
    """The checkpointed allocations, touching nothing (for commands that act on the node while
    the daemon is stopped); ValueError if the checkpoint is unreadable."""
    try:
        text = path(host).read_text()
    except FileNotFoundError:
        return []
    try:
        data = json.loads(text)
        if data.get("version") != VERSION:
            raise ValueError(f"unknown checkpoint version {data.get('version')!r}")
        return [Allocation.from_checkpoint(a) for a in data["allocations"]]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(str(e)) from None


def load(host: HostRoot) -> list[Allocation]:
    """The checkpointed allocations. An unreadable checkpoint is kept aside (never
    overwritten silently) and the agent starts with none."""
    p = path(host)
    try:
        return read(host)
    except ValueError as e:
        aside = p.with_name(f"{p.name}.unreadable-{int(time.time())}")
        p.rename(aside)
        log.error("allocations checkpoint is unreadable (%s); kept as %s, starting with none",
                  e, aside, extra={"fields": {"checkpoint": str(aside)}})
        return []


def save(host: HostRoot, allocations) -> None:
    """One allocation a line, each rendered once for its life (``checkpoint_json``): a save
    joins strings, it does not re-encode every allocation."""
    ensure_dir(host.state_dir, 0o700)
    entries = ",\n".join(a.checkpoint_json for a in allocations)
    write_atomic(path(host), f'{{"version":{VERSION},"allocations":[\n{entries}\n]}}\n', mode=0o600)


def stray_temporaries(host: HostRoot) -> list[Path]:
    """Temporary files of checkpoint writes a kill interrupted."""
    p = path(host)
    return sorted(p.parent.glob(f".{p.name}.*.tmp")) if p.parent.is_dir() else []
