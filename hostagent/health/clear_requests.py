"""Clear requests for a monitor running in another process, until the daemon's API carries
them: a request file in ``/run/hostagent/health-requests``, answered by a result file.

The monitor looks for requests once per wait (at most ``wait_timeout_ms`` apart), applies
``state.clear`` and writes the outcome; the requester waits for it and so learns whether a
monitor is there at all.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..errors import HostagentError, UnavailableError
from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot

__all__ = ["REQUEST_DIR", "ClearRequest", "submit_clear", "pending_requests", "answer", "await_answer",
           "answer_error"]

REQUEST_DIR = "health-requests"


@dataclass(frozen=True)
class ClearRequest:
    path: Path
    devices: tuple[str, ...] | None       # None: every device


def _dir(host: HostRoot) -> Path:
    return host.run_dir / REQUEST_DIR


def submit_clear(host: HostRoot, devices: list[str] | None) -> Path:
    ensure_dir(_dir(host), 0o700)
    path = _dir(host) / f"{uuid.uuid4().hex}.request"
    write_atomic(path, json.dumps({"devices": devices, "pid": os.getpid(), "at": time.time()}),
                 mode=0o600, durable=False)
    return path


def pending_requests(host: HostRoot) -> list[ClearRequest]:
    try:
        entries = sorted(os.scandir(_dir(host)), key=lambda e: e.stat().st_mtime_ns)
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        if not entry.name.endswith(".request"):
            continue
        path = Path(entry.path)
        try:
            devices = json.loads(path.read_text())["devices"]
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)       # torn or foreign: nobody waits on it usefully
            continue
        out.append(ClearRequest(path, None if devices is None else tuple(map(str, devices))))
    return out


def answer(request: ClearRequest, *, cleared: list[str] | None = None,
           error: HostagentError | None = None) -> None:
    result = {"ok": error is None, "cleared": cleared or []}
    if error is not None:
        result["error"] = error.to_dict()
    write_atomic(request.path.with_suffix(".result"), json.dumps(result), mode=0o600, durable=False)
    request.path.unlink(missing_ok=True)


def await_answer(path: Path, timeout: float) -> dict:
    result = path.with_suffix(".result")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            doc = json.loads(result.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
            continue
        result.unlink(missing_ok=True)
        return doc
    path.unlink(missing_ok=True)
    raise UnavailableError(f"no health monitor answered within {timeout:g}s",
                           hint="health is watched by the daemon; without it run "
                                "'hostagent health watch'")


def answer_error(result: dict) -> HostagentError:
    """The error a monitor answered with, as the hostagent error of the same code."""
    from .. import errors
    doc = result.get("error") or {}
    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, HostagentError) and cls.code == doc.get("code"):
            return cls(doc.get("message", "the health monitor refused the request"))
    return HostagentError(doc.get("message", "the health monitor refused the request"))
