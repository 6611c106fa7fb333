"""/proc/self/mountinfo, just what the ldconfig sandbox needs to check its mounts."""

from __future__ import annotations


class Mount:
    __slots__ = ("point", "options", "fstype")

    def __init__(self, point: str, options: frozenset, fstype: str):
        self.point, self.options, self.fstype = point, options, fstype

    def __repr__(self) -> str:
        return f"Mount({self.point!r}, {self.fstype}, {','.join(sorted(self.options))})"


def parse(text: str) -> list[Mount]:
    """Lines look like ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw``:
    field 5 is the mount point (octal escapes for blanks), field 6 the per-mount options,
    and the filesystem type follows the ``-`` separator."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            mounts.append(Mount(unescape(fields[4]), frozenset(fields[5].split(",")), fields[sep + 1]))
        except (ValueError, IndexError):
            raise ValueError(f"unexpected mountinfo line: {line[:200]!r}") from None
    return mounts


def read(path: str = "/proc/self/mountinfo") -> list[Mount]:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return parse(f.read())


def unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def under(point: str, root: str) -> bool:
    """Whether mount point ``point`` is ``root`` or inside it (both canonical paths)."""
    return point == root or point.startswith(root.rstrip("/") + "/")


def containing(mounts: list[Mount], path: str) -> Mount | None:
    """The mount that ``path`` itself lies on (the deepest mount point above it); with
    stacked mounts the last listed, which is the visible one."""
    best = None
    for m in mounts:
        if under(path, m.point) and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best
