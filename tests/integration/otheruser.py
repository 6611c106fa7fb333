"""Work done as another user: in a forked child of the tests' process (not an exec: that
user may not be able to read this interpreter) that drops to the uid, gid and groups given,
its result handed back as JSON."""

from __future__ import annotations

import json
import os

__all__ = ["in_child_as"]


def in_child_as(work, uid: int, gid: int, groups=()):
    """``work()`` in a child running as ``uid``/``gid``/``groups``; what it returned (a JSON
    value). The child failing is an AssertionError here."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            os.write(w, json.dumps(work()).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and data, f"the child running as uid {uid} failed"
    return json.loads(data)
