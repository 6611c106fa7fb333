"""The GPUs the agent has put on vfio-pci, each with the drivers its functions go back to:
``passthrough/bound.json`` in the state directory, written (atomically, durably) before a
GPU moves, rewritten once it is back.

The checkpoint names the GPUs its allocations hold and the journal the one move under way,
but a crash between two writes (a replaced allocation's GPU not yet bound back, a release
half done, an allocation dropped at start) leaves a GPU on vfio-pci that neither names.
This record outlives both, so at start the agent binds back what it moved and nothing
holds (``executor.sweep``), a new passthrough of such a GPU keeps the drivers it came
from, and a GPU an admin bound to vfio-pci by hand, which it never names, is left alone.
"""

from __future__ import annotations

import json

from ..errors import StateError
from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot

__all__ = ["load", "keep", "forget", "FOLDER", "FILE"]

FOLDER = "passthrough"         # under the state directory, beside the journal
FILE = "bound.json"


def _path(host: HostRoot):
    return host.state_dir / FOLDER / FILE


def load(host: HostRoot) -> dict[str, dict]:
    """PCI bus id of each GPU the agent moved -> its passthrough record (``functions``
    with the drivers they go back to, ``persistence``, ``uuid``, ``group``)."""
    path = _path(host)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not all(isinstance(r, dict) and isinstance(r.get("functions"), list)
                                                 for r in data.values()):
            raise ValueError("not a map of passthrough records")
        return data
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise StateError(f"the record of GPUs the agent put on vfio-pci cannot be read ({e})", where=str(path),
                         hint="bind each GPU in it back by hand if it is on vfio-pci "
                              "(/sys/bus/pci/devices/<bdf>/driver), then remove the file") from None


def _save(host: HostRoot, records: dict[str, dict]) -> None:
    path = _path(host)
    ensure_dir(path.parent, 0o700)
    write_atomic(path, json.dumps(records, indent=1, sort_keys=True), mode=0o600)


def keep(host: HostRoot, record: dict) -> None:
    """The GPU of ``record`` is (about to be) on vfio-pci through the agent."""
    records = load(host)
    fields = ("gpu", "uuid", "group", "functions", "persistence")
    entry = {k: record.get(k) for k in fields}
    if records.get(record["gpu"]) != entry:
        records[record["gpu"]] = entry
        _save(host, records)


def forget(host: HostRoot, bdf: str) -> None:
    """The GPU at ``bdf`` is back on its drivers."""
    records = load(host)
    if records.pop(bdf, None) is not None:
        _save(host, records)
