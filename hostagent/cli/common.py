"""Helpers shared by the command modules."""

from __future__ import annotations

__all__ = ["host_from_args"]


def host_from_args(args):
    from ..hostroot import HostRoot
    return HostRoot.from_env(getattr(args, "simulate", None))
