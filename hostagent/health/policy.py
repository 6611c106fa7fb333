"""Which XIDs make a device unhealthy: the device plugin's skip list and its switches.

The defaults are the device plugin's "application errors, the GPU should still be healthy"
(13, 31, 43, 45, 68, 109). ``disable`` adds XIDs to ignore, or ignores every XID with
``all`` (or ``xids``); ``enable`` makes XIDs count again whatever the defaults and the
disable list say, or every XID with ``all`` (DP_DISABLE_HEALTHCHECKS and
DP_ENABLE_HEALTHCHECKS). Ignored XIDs are still recorded, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..errors import ConfigError

__all__ = ["DEFAULT_IGNORED_XIDS", "XidPolicy", "parse_xids"]

DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_ALL = ("all", "xids")


def parse_xids(items, what: str) -> tuple[bool, frozenset[int]]:
    """(everything, xids) from "13,31", "all", or a list of numbers and words."""
    if items is None:
        return False, frozenset()
    if isinstance(items, (str, int)):
        items = [items]
    everything, xids = False, set()
    for item in items:
        for part in str(item).split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part in _ALL:
                everything = True
            elif part.isascii() and part.isdigit() and int(part) > 0:
                xids.add(int(part))
            else:
                raise ConfigError(f"{what}: {part!r} is neither an XID number nor 'all'",
                                  hint="give XIDs as positive numbers, e.g. [13, 31], or 'all'")
    return everything, frozenset(xids)


@dataclass(frozen=True)
class XidPolicy:
    ignore_all: bool = False
    ignored_extra: frozenset[int] = frozenset()
    count_all: bool = False
    counted: frozenset[int] = frozenset()

    @classmethod
    def from_lists(cls, disable: Iterable | str | None = (), enable: Iterable | str | None = ()) -> "XidPolicy":
        ignore_all, ignored = parse_xids(disable, "health.disable_xids")
        count_all, counted = parse_xids(enable, "health.enable_xids")
        return cls(ignore_all, ignored, count_all, counted)

    def ignored(self, xid: int) -> bool:
        if self.count_all or xid in self.counted:
            return False
        return self.ignore_all or xid in DEFAULT_IGNORED_XIDS or xid in self.ignored_extra

    def describe(self) -> str:
        if self.count_all:
            return "every XID counts"
        if self.ignore_all:
            kept = ", ".join(map(str, sorted(self.counted))) or "none"
            return f"XIDs ignored except {kept}"
        ignored = sorted((DEFAULT_IGNORED_XIDS | self.ignored_extra) - self.counted)
        return "ignored XIDs: " + (", ".join(map(str, ignored)) or "none")
