"""What ``modinfo`` reads from a kernel module file: its ``.modinfo`` section
(NUL-separated ``key=value`` strings: version, license, ...) and whether a signature is
appended (the kernel's ``~Module signature appended~`` trailer).

The NVIDIA kernel modules say which flavour they are in ``license``: the open modules are
"Dual MIT/GPL", the proprietary ones "NVIDIA".
"""

from __future__ import annotations

import gzip
import lzma
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModuleInfo", "read_module_info", "SIGNATURE_MAGIC", "flavour_of_license"]

SIGNATURE_MAGIC = b"~Module signature appended~\n"
_MAX_BYTES = 256 << 20         # the proprietary nvidia.ko is ~70 MB uncompressed


@dataclass(frozen=True)
class ModuleInfo:
    path: str
    fields: dict
    signed: bool

    @property
    def version(self) -> str | None:
        return self.fields.get("version")

    @property
    def flavour(self) -> str | None:
        return flavour_of_license(self.fields.get("license"))


def flavour_of_license(license_: str | None) -> str | None:
    if license_ is None:
        return None
    return "open" if "MIT" in license_ or "GPL" in license_ else "proprietary"


def _content(path: Path):
    """The module's bytes (mapped, not read, when uncompressed: nvidia.ko is large)."""
    name = path.name
    if name.endswith(".ko"):
        with open(path, "rb") as f:
            try:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:          # an empty file
                return b""
    if name.endswith(".ko.xz"):
        return lzma.open(path).read(_MAX_BYTES)
    if name.endswith(".ko.gz"):
        return gzip.open(path).read(_MAX_BYTES)
    return None                # .ko.zst: no decompressor in the standard library


def read_module_info(path: str | Path) -> ModuleInfo | None:
    """The module's fields and signature state; None if it is not a readable ELF64 module.
    Failing to open ``path`` raises OSError."""
    path = Path(path)
    data = _content(path)
    if data is None or data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        return None
    try:
        shoff, = struct.unpack_from("<Q", data, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
        sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_off = sections[shstrndx][4]
        fields = {}
        for name_off, _, _, _, offset, size in sections:
            end = data.find(b"\0", names_off + name_off)
            if end < 0 or data[names_off + name_off:end] != b".modinfo":
                continue
            for item in data[offset:offset + size].split(b"\0"):
                key, sep, value = item.decode(errors="replace").partition("=")
                if sep:
                    fields.setdefault(key, value)
        signed = data[-len(SIGNATURE_MAGIC):] == SIGNATURE_MAGIC
    except (struct.error, IndexError, ValueError):
        return None
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
    return ModuleInfo(str(path), fields, signed)
