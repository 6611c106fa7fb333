"""Helpers shared by the command modules."""

from __future__ import annotations

from ..hostroot import HostRoot

__all__ = ["host_from_args"]


def host_from_args(args) -> HostRoot:
    return HostRoot.from_env(getattr(args, "simulate", None))
