"""Read an ELF shared object's SONAME, as the dynamic loader and ldconfig see it."""

from __future__ import annotations

import os
import struct

__all__ = ["read_soname"]

_EHDR, _PHDR, _SHDR, _SYM, _DYN = 64, 56, 64, 24, 16  # ELF64 record sizes
_PT_LOAD, _PT_DYNAMIC, _PT_GNU_STACK = 1, 2, 0x6474E551
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT, _DT_SONAME = 0, 4, 5, 6, 10, 11, 14
_SHT_STRTAB, _SHT_HASH, _SHT_DYNAMIC, _SHT_DYNSYM = 3, 5, 6, 11
_SHF_WRITE, _SHF_ALLOC = 1, 2
_PF_W, _PF_R = 2, 4
_MAX_DYN_BYTES = 1 << 16  # read_soname never looks at more .dynamic than this
_MAX_NAME = 4096


def read_soname(path: str | os.PathLike) -> str | None:
    """Return DT_SONAME of an ELF64 LE file, or None if it is not one or has none.

    Malformed content never raises; failing to open ``path`` raises OSError.
    """
    with open(path, "rb") as f:
        def read(off: int, n: int) -> bytes | None:
            f.seek(off)
            data = f.read(n)
            return data if len(data) == n else None

        try:
            # ELF header: require ELF64, little-endian, sane program header entries.
            eh = read(0, _EHDR)
            if eh is None or eh[:4] != b"\x7fELF" or eh[4] != 2 or eh[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", eh, 32)
            phentsize, phnum = struct.unpack_from("<HH", eh, 54)
            if phentsize < _PHDR or phnum == 0:
                return None
            # Program headers: collect PT_LOAD mappings and the PT_DYNAMIC extent.
            loads, dyn = [], None
            for i in range(phnum):
                ph = read(phoff + i * phentsize, _PHDR)
                if ph is None:
                    return None
                ptype, _, off, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", ph)
                if ptype == _PT_LOAD:
                    loads.append((vaddr, off, filesz))
                elif ptype == _PT_DYNAMIC and dyn is None:
                    dyn = (off, min(filesz, _MAX_DYN_BYTES))
            if dyn is None:
                return None
            # .dynamic: scan entries up to DT_NULL for DT_SONAME, DT_STRTAB, DT_STRSZ.
            raw = read(dyn[0], dyn[1] - dyn[1] % _DYN) or b""
            tags: dict[int, int] = {}
            for tag, val in struct.iter_unpack("<qQ", raw):
                if tag == _DT_NULL:
                    break
                tags.setdefault(tag, val)
            if _DT_SONAME not in tags or _DT_STRTAB not in tags:
                return None
            # Map the string table's address to a file offset through PT_LOAD.
            strtab = tags[_DT_STRTAB]
            base = next((off + strtab - va for va, off, sz in loads if va <= strtab < va + sz), None)
            if base is None:
                return None
            limit = tags.get(_DT_STRSZ, _MAX_NAME + 1) - tags[_DT_SONAME]
            f.seek(base + tags[_DT_SONAME])
            chunk = f.read(max(0, min(limit, _MAX_NAME + 1)))
            end = chunk.find(b"\0")
            if end <= 0:  # unterminated within bounds, or empty name
                return None
            return chunk[:end].decode()
        except (OSError, ValueError, OverflowError, struct.error):
            return None
