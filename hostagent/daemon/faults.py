"""Crash points for tests: ``HOSTAGENT_FAULT=allocate:after_spec,...`` makes the daemon kill
itself with SIGKILL when it reaches a named point, so tests can show that every crash window
of an allocation or a release ends consistent after a restart; ``NAME=stop`` stops it there
instead (SIGSTOP), so a test can act while it is held at that point and then continue it;
``NAME=hang`` blocks the thread that reaches it for good (work that never ends).
Unset in production: each point then costs one set lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["point", "POINTS", "HANGS"]

POINTS = ("allocate:after_spec", "allocate:after_checkpoint", "release:after_checkpoint",
          "release:after_spec", "start:settings_read", "sharing:after_stops", "passthrough:bound_one",
          "passthrough:released")
_ARMED = frozenset(p.strip() for p in os.environ.get("HOSTAGENT_FAULT", "").split(",") if p.strip())
# A point may block its thread for good: work that reaches one never runs on the event loop.
HANGS = any(p.endswith("=hang") for p in _ARMED)


def point(name: str) -> None:
    if name in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
    elif f"{name}=stop" in _ARMED:
        os.kill(os.getpid(), signal.SIGSTOP)
    elif f"{name}=hang" in _ARMED:
        import threading
        threading.Event().wait()
