"""The node's GFD-compatible labels as the daemon keeps them: computed from each inventory
read with the ``labels:`` section's strategies, written to NFD's local features file when
they changed, and served at ``GET /v1/labels``.

Labels describe the inventory only (not health): a device going unhealthy does not relabel
the node, so the scheduler's view does not flap with transient XIDs. With ``timestamp`` (as
GFD by default) the file carries ``nvidia.com/gfd.timestamp``: when its labels last changed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..hostroot import HostRoot

__all__ = ["LabelSettings", "LabelResult", "compute_and_write", "mig_strategy"]

log = logging.getLogger("hostagent.daemon")


@dataclass(frozen=True)
class LabelSettings:
    write: bool = True
    timestamp: bool = True
    mig_strategy: str | None = None       # None: the sharing configuration's flags say
    sharing_strategy: str = "none"
    replicas: int = 1

    @classmethod
    def from_sections(cls, sections: dict) -> "LabelSettings":
        return cls(**(sections.get("labels") or {}))


@dataclass(frozen=True)
class LabelResult:
    labels: dict
    path: str
    written: bool = False           # this read rewrote the file
    error: str | None = None        # why the file could not be written

    def view(self) -> dict:
        return {"labels": self.labels, "file": {"path": self.path, "error": self.error}}


def device_sharing(host: HostRoot) -> dict | None:
    """uuid -> Sharing of the sharing configuration in force (hostagent's MPS daemons and
    time-slicing); None when hostagent shares nothing, and the labels section says."""
    from ..labels import Sharing
    from ..sharing.state import SharingState, state_path
    if not state_path(host).exists():
        return None
    return {u: Sharing(d.strategy, d.replicas, d.rename is not None)
            for u, d in SharingState.load(host).devices.items()}


def mig_strategy(host: HostRoot, setting: str | None) -> str:
    """The MIG strategy of the labels (and so of the device plugin, which follows them): the
    one set (a command-line flag, else the labels section), else the sharing configuration's
    flags.migStrategy, which GFD and the device plugin read from the same file, else none."""
    if setting is not None:
        return setting
    from ..errors import HostagentError
    from ..sharing.config import load_persisted
    try:
        return load_persisted(host).mig_strategy or "none"
    except HostagentError:            # the sharing reconcile says what is wrong with the file
        return "none"


def compute_and_write(host: HostRoot, inventory, settings: LabelSettings) -> LabelResult:
    """Worker thread: the labels of ``inventory``; the features file rewritten if they differ
    from its content. A file that cannot be written is reported, never fatal. The sharing
    labels follow the sharing in force when hostagent shares devices, else the settings."""
    from ..labels import FEATURES_FILE, Sharing, node_labels, write_labels
    from ..labels.hostfacts import gpu_mode, machine_type
    labels = node_labels(inventory, mig_strategy=mig_strategy(host, settings.mig_strategy),
                         sharing=Sharing(settings.sharing_strategy, settings.replicas),
                         machine=machine_type(host), gpu_mode=gpu_mode(host, inventory),
                         device_sharing=device_sharing(host))
    path = str(host.host(FEATURES_FILE))
    if not settings.write:
        return LabelResult(labels, path)       # no file: no time it was written
    try:
        written, labels = write_labels(host, labels,
                                       timestamp=int(time.time()) if settings.timestamp else None)
    except OSError as e:
        return LabelResult(labels, path, error=f"cannot write {path}: {e.strerror or e}")
    if written:
        log.info("node labels written to %s (%d labels)", path, len(labels))
    return LabelResult(labels, path, written=written)
