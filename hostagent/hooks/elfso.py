"""What ldconfig reads from a shared object for the cache: its SONAME and its flags.

Follows glibc's ``elf/readelflib.c``: an ELF file that is not ET_DYN, has no PT_DYNAMIC or
no DT_STRTAB, or whose pointers leave the file is not a library (None, skipped as ldconfig
skips it); the SONAME is the first DT_SONAME, through the PT_LOAD segment that maps
DT_STRTAB. The flags are those ldconfig gives the host's own kind of 64-bit library (always
"libc6" there: x86-64 0x0303, AArch64 0x0a03). Any other ELF object raises Unsupported: the
caller leaves such a folder to ldconfig itself.

The file is the image's: every read is bounded and positioned (``pread``), nothing is
trusted to fit, and a dynamic segment is read no further than its own size (at most 64 KiB:
a real library's is a few hundred bytes, and ends with DT_NULL, where ldconfig stops). One
without DT_NULL there is left to ldconfig (Unsupported), which would read on past it.
"""

import posix
import struct

__all__ = ["Unsupported", "read", "HOST_FLAGS"]

# e_machine -> flags, for the host's machine only (the one ldconfig would run on).
HOST_FLAGS = {"x86_64": {62: 0x0303}, "aarch64": {183: 0x0A03}}.get(posix.uname().machine, {})
_EHDR = struct.Struct("<4sBB10xHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_DYN = struct.Struct("<qQ")
_ET_DYN, _PT_LOAD, _PT_DYNAMIC = 3, 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_MAX_PHDRS = 4096
_MAX_DYNAMIC = 1 << 16
_MAX_NAME = 4096


class Unsupported(Exception):
    """An ELF object whose cache entry this module does not compute (another class, byte
    order or machine)."""


def read(fd: int, size: int, budget=None) -> tuple[bytes | None, int] | None:
    """(SONAME or None, flags) of the regular file open at ``fd`` (``size`` bytes), or None
    when ldconfig would not list it. ``budget`` (budget.Budget): the run's, charged with
    every byte read."""
    file = _File(fd, size, budget)
    head = file.at(0, _EHDR.size)
    if len(head) < _EHDR.size or head[:4] != b"\x7fELF":
        return None
    _, cls, data, etype, machine, _, _, phoff, _, _, _, _, phnum, _, _, _ = _EHDR.unpack(head)
    if cls != 2 or data != 1 or machine not in HOST_FLAGS:
        raise Unsupported(f"ELF class {cls}, data {data}, machine {machine}")
    if etype != _ET_DYN or phnum > _MAX_PHDRS:
        return None
    table = file.at(phoff, _PHDR.size * phnum)
    if len(table) < _PHDR.size * phnum:
        return None                                  # "file is truncated"
    loads, dynamic = [], None
    for ptype, _, offset, vaddr, _, filesz, _, _ in _PHDR.iter_unpack(table):
        if ptype == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif ptype == _PT_DYNAMIC:
            dynamic = (offset, filesz)                 # the last one, as ldconfig
    if dynamic is None or dynamic[1] == 0 or dynamic[0] >= size:
        return None
    entries = _dynamic(file, dynamic[0], min(dynamic[1], size - dynamic[0]))
    strtab = next((value for tag, value in entries if tag == _DT_STRTAB), None)
    if strtab is None:
        return None
    base = next((vaddr - offset for vaddr, offset, filesz in loads if vaddr <= strtab < vaddr + filesz), 0)
    strings = strtab - base
    if not 0 <= strings <= size:
        return None
    soname = next((value for tag, value in entries if tag == _DT_SONAME), None)
    if soname is None:
        return None, HOST_FLAGS[machine]
    if strings + soname > size:
        return None
    name = file.at(strings + soname, _MAX_NAME)
    end = name.find(b"\0")
    if end < 0 and strings + soname + len(name) < size:
        return None                                  # longer than any file name
    return name[:end] if end >= 0 else name, HOST_FLAGS[machine]


class _File:
    """Positioned reads, the first 4 KiB read once: a small library's headers, dynamic
    section and strings all lie there."""

    __slots__ = ("fd", "size", "head", "budget")

    def __init__(self, fd: int, size: int, budget=None):
        self.fd, self.size, self.budget = fd, size, budget
        if budget is not None:
            budget.read(4096)
        self.head = posix.pread(fd, 4096, 0)

    def at(self, offset: int, length: int) -> bytes:
        """At most ``length`` bytes from ``offset`` (fewer at the end of the file: the
        header's offsets are the image's, and may point anywhere)."""
        if offset + length <= len(self.head):
            return self.head[offset:offset + length]
        if offset >= self.size:
            return b""
        length = min(length, self.size - offset)
        if self.budget is not None:
            self.budget.read(length)
        return posix.pread(self.fd, length, offset)


def _dynamic(file: _File, offset: int, length: int) -> list[tuple[int, int]]:
    """The dynamic entries before DT_NULL, read from the segment's own bytes only."""
    if length > _MAX_DYNAMIC:
        raise Unsupported(f"a dynamic segment of {length} bytes")
    raw = file.at(offset, length - length % _DYN.size)
    entries = []
    for tag, value in _DYN.iter_unpack(raw[:len(raw) - len(raw) % _DYN.size]):
        if tag == _DT_NULL:
            return entries
        entries.append((tag, value))
    raise Unsupported("a dynamic segment without DT_NULL")
