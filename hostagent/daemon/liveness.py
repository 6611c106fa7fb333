"""Is the agent's work moving? What its liveness probe (``hostagentd --check``, ``GET
/v1/live``) and the systemd watchdog ask.

The API answers from the event loop, so a socket that answers says nothing of the work
behind it: the worker thread (NVML, files, processes) and the mutex every change takes. A
call on the worker that runs past its budget, or the mutex held past ``MUTEX_BUDGET`` while
the worker does nothing, means the work is stuck: the probe fails and the agent is
restarted, instead of answering reads while every change waits forever. The budgets are
``daemon.work_timeout`` (a MIG apply gets its own, longer one).
"""

from __future__ import annotations

import asyncio
import functools
import time

__all__ = ["TimedLock", "WorkClock", "DEFAULT"]

DEFAULT = object()          # the call's budget is the clock's default (daemon.work_timeout)


class TimedLock(asyncio.Lock):
    """The agent's mutex, knowing since when it is held."""

    held_since: float | None = None

    async def acquire(self) -> bool:
        await super().acquire()
        self.held_since = time.monotonic()
        return True

    def release(self) -> None:
        self.held_since = None
        super().release()


def _name(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or repr(fn)


class WorkClock:
    """What the worker runs now (and since when, with which budget), and since when it idles."""

    def __init__(self, budget: float):
        self.budget = budget        # seconds, for a call and for the mutex held with no call running
        self.busy: tuple[str, float, float | None] | None = None
        self.idle_since = time.monotonic()

    def timed(self, fn, budget=DEFAULT):
        """``fn`` as the worker runs it, clocked (``budget`` None: no limit)."""
        what = _name(fn)
        budget = self.budget if budget is DEFAULT else budget

        def run(*args):
            self.busy = (what, time.monotonic(), budget)
            try:
                return fn(*args)
            finally:
                self.busy = None
                self.idle_since = time.monotonic()
        return run

    def stuck(self, mutex: TimedLock, now: float | None = None) -> str | None:
        """Why the work is stuck; None while it moves."""
        now = time.monotonic() if now is None else now
        busy = self.busy
        if busy is not None:
            what, since, budget = busy
            if budget is not None and now - since > budget:
                return f"the worker has run {what} for {now - since:.0f} s (its budget is {budget:g} s)"
            return None
        held = mutex.held_since
        if held is not None and now - max(held, self.idle_since) > self.budget:
            return (f"the agent's mutex has been held for {now - held:.0f} s with no work running "
                    f"(more than {self.budget:g} s)")
        return None
