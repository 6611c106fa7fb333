"""Waiting for something the tests cannot be told about: one function for every test."""

from __future__ import annotations

import time

__all__ = ["until"]


def until(predicate, timeout: float = 10.0, what="the condition", interval: float = 0.05):
    """``predicate()``'s first true value, asked every ``interval`` seconds; AssertionError
    after ``timeout`` seconds naming ``what`` (a callable: what it says then, such as the
    state that never changed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(what() if callable(what) else f"no {what} after {timeout:g} s")
        time.sleep(interval)
