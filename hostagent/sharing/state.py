"""What hostagent did to the node for sharing, kept in ``/var/lib/hostagent/sharing.json``.

The sharing in force (per device, as resolved when it was applied), the compute mode each
GPU had before hostagent changed it (restored on ``off``), the time-slice interval it set,
and its MPS daemons (the process as the kernel showed it when the daemon started: pid, start
time, executable; the settings sent; restarts). This is the only place a daemon's pid comes
from: never its pid file, which sits among what clients use. Written atomically after
every change, so an agent that restarts adopts its daemons and a later ``off`` restores
what was there before, whichever process made the change (the CLI or the daemon).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..errors import StateError
from ..hostroot import HostRoot
from ..processes import ProcessRecord
from .resolve import DeviceSharing

__all__ = ["SharingState", "DaemonRecord", "state_path"]

VERSION = 1


@dataclass
class DaemonRecord:
    uuid: str                      # the device it serves
    pid: int | None = None
    started: float | None = None
    settings: dict = field(default_factory=dict)     # active_thread_percentage, pinned_memory_limit_mib
    restarts: int = 0
    process: dict | None = None    # ProcessRecord.to_dict(); None in a record of an older agent

    @property
    def known(self) -> ProcessRecord | None:
        """The daemon's process as recorded (None: not recorded, never trusted by pid alone)."""
        try:
            return ProcessRecord.from_dict(self.process)
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class SharingState:
    devices: dict[str, DeviceSharing] = field(default_factory=dict)   # in force
    saved_modes: dict[str, str] = field(default_factory=dict)         # GPU uuid -> mode before us
    intervals: dict[str, str] = field(default_factory=dict)           # GPU uuid -> interval we set
    daemons: dict[str, DaemonRecord] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"version": VERSION, "devices": {u: asdict(d) for u, d in self.devices.items()},
                "saved_compute_modes": self.saved_modes, "intervals": self.intervals,
                "daemons": {u: asdict(d) for u, d in self.daemons.items()}}

    @classmethod
    def from_dict(cls, raw: dict) -> "SharingState":
        return cls(devices={u: DeviceSharing(**d) for u, d in raw.get("devices", {}).items()},
                   saved_modes=dict(raw.get("saved_compute_modes", {})),
                   intervals=dict(raw.get("intervals", {})),
                   daemons={u: DaemonRecord(**d) for u, d in raw.get("daemons", {}).items()})

    @classmethod
    def load(cls, host: HostRoot) -> "SharingState":
        path = state_path(host)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            return cls()
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise StateError(f"the sharing state is corrupt ({type(e).__name__}: {e})", where=str(path),
                             hint="stop the MPS daemons it names (echo quit | nvidia-cuda-mps-control with "
                                  "their CUDA_MPS_PIPE_DIRECTORY), reset compute modes with nvidia-smi -c, "
                                  "then remove the file") from None

    def save(self, host: HostRoot) -> None:
        from ..fileio import ensure_dir, write_atomic
        path = state_path(host)
        if not (self.devices or self.saved_modes or self.intervals or self.daemons):
            from ..fileio import remove
            if path.exists():
                remove(path)
            return
        ensure_dir(path.parent, 0o700)
        write_atomic(path, json.dumps(self.to_dict(), indent=1, sort_keys=True), mode=0o600)


def state_path(host: HostRoot):
    return host.state_dir / "sharing.json"
