"""Crash points for tests: ``HOSTAGENT_FAULT=allocate:after_spec,...`` makes the daemon kill
itself with SIGKILL when it reaches a named point, so tests can show that every crash window
of an allocation or a release ends consistent after a restart; ``NAME=stop`` stops it there
instead (SIGSTOP), so a test can act while it is held at that point and then continue it;
``NAME=hang`` blocks the thread that reaches it for good (work that never ends).
``write:FILE`` is the middle of an atomic write of a file named FILE (its temporary file
written, not yet renamed: ``fileio``), whichever command writes it; ``checkpoint:mid_line``
the middle of a journal line (half of it written) and ``checkpoint:after_snapshot`` a
compaction's snapshot written, its journal not yet emptied.
Unset in production: each point then costs one set lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["point", "armed", "POINTS", "HANGS"]

POINTS = ("allocate:after_spec", "allocate:after_checkpoint", "release:after_checkpoint",
          "release:after_spec", "start:settings_read", "sharing:after_stops", "checkpoint:mid_line",
          "checkpoint:after_snapshot", "write:FILE", "passthrough:bound_one", "passthrough:released",
          "passthrough:committed")
_ARMED = frozenset(p.strip() for p in os.environ.get("HOSTAGENT_FAULT", "").split(",") if p.strip())
# A point may block its thread for good: work that reaches one never runs on the event loop.
HANGS = any(p.endswith("=hang") for p in _ARMED)


def armed(name: str) -> bool:
    """Whether point ``name`` does anything (in any of its modes)."""
    return bool(_ARMED) and any(p == name or p.startswith(name + "=") for p in _ARMED)


def point(name: str) -> None:
    if not _ARMED:
        return
    # Sent to this thread: a signal sent to the process may be taken by another thread
    # first, and this one run on a few more system calls (past the point) before it stops.
    import threading
    if name in _ARMED:
        signal.pthread_kill(threading.get_ident(), signal.SIGKILL)
    elif f"{name}=stop" in _ARMED:
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif f"{name}=hang" in _ARMED:
        threading.Event().wait()
