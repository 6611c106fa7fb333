"""Minimal, real ELF64 shared objects for simulated driver libraries.

The generated file is a valid little-endian ET_DYN object with no code: one
PT_LOAD segment mapping the whole file, a PT_DYNAMIC carrying DT_SONAME, a
SysV hash table, a symbol table holding only the null symbol, and section
headers. readelf, ldconfig and glibc's ld.so (ctypes.CDLL) accept it.
"""

from __future__ import annotations

import os
import platform
import struct

from ..driver.elf import (_DT_HASH, _DT_NULL, _DT_SONAME, _DT_STRSZ, _DT_STRTAB, _DT_SYMENT,
                          _DT_SYMTAB, _DYN, _EHDR, _PF_R, _PF_W, _PHDR, _PT_DYNAMIC,
                          _PT_GNU_STACK, _PT_LOAD, _SHDR, _SHF_ALLOC, _SHF_WRITE, _SHT_DYNAMIC,
                          _SHT_DYNSYM, _SHT_HASH, _SHT_STRTAB, _SYM, read_soname)
from ..fileio import write_atomic

_MACHINES = {"x86_64": 62, "aarch64": 183}  # EM_X86_64, EM_AARCH64
_HOST_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
DEFAULT_MACHINE = _HOST_ALIASES.get(platform.machine().lower(), "x86_64")



def _align(n: int, a: int = 8) -> int:
    return (n + a - 1) & -a


def shared_object_bytes(soname: str, *, machine: str = DEFAULT_MACHINE) -> bytes:
    """Return the bytes of an ELF64 LE shared object whose DT_SONAME is ``soname``."""
    if machine not in _MACHINES:
        raise ValueError(f"unsupported machine {machine!r}; supported: {', '.join(sorted(_MACHINES))}")
    name = soname.encode()
    if not name or b"\0" in name:
        raise ValueError("soname must be a non-empty string without NUL bytes")

    # File layout (file offset == virtual address, everything in one segment).
    nph = 3
    hash_off = _EHDR + nph * _PHDR
    hash_data = struct.pack("<4I", 1, 1, 0, 0)  # nbucket=1, nchain=1, bucket[0]=chain[0]=STN_UNDEF
    dynsym_off = _align(hash_off + len(hash_data))
    dynsym = bytes(_SYM)  # only the mandatory null symbol
    dynstr_off = dynsym_off + len(dynsym)
    dynstr = b"\0" + name + b"\0"
    dynamic_off = _align(dynstr_off + len(dynstr))
    dynamic = b"".join(struct.pack("<qQ", tag, val) for tag, val in (
        (_DT_SONAME, 1), (_DT_HASH, hash_off), (_DT_STRTAB, dynstr_off), (_DT_SYMTAB, dynsym_off),
        (_DT_STRSZ, len(dynstr)), (_DT_SYMENT, _SYM), (_DT_NULL, 0)))
    shstrtab_off = dynamic_off + len(dynamic)
    names = [b"", b".hash", b".dynsym", b".dynstr", b".dynamic", b".shstrtab"]
    shstrtab = b"\0".join(names) + b"\0"
    name_at = [shstrtab.index(b"\0" + n + b"\0") + 1 if n else 0 for n in names]
    shoff = _align(shstrtab_off + len(shstrtab))
    size = shoff + len(names) * _SHDR

    # ELF header: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, SysV ABI; ET_DYN.
    ehdr = struct.pack("<4sBBBBB7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0,
                       3, _MACHINES[machine], 1, 0, _EHDR, shoff, 0,
                       _EHDR, _PHDR, nph, _SHDR, len(names), len(names) - 1)

    # Program headers: one RW PT_LOAD for the whole file (ld.so rewrites .dynamic
    # in place), PT_DYNAMIC, and PT_GNU_STACK so the stack stays non-executable.
    def phdr(ptype: int, flags: int, off: int, sz: int, align: int) -> bytes:
        return struct.pack("<IIQQQQQQ", ptype, flags, off, off, off, sz, sz, align)

    phdrs = (phdr(_PT_LOAD, _PF_R | _PF_W, 0, size, 0x10000)
             + phdr(_PT_DYNAMIC, _PF_R | _PF_W, dynamic_off, len(dynamic), 8)
             + phdr(_PT_GNU_STACK, _PF_R | _PF_W, 0, 0, 16))

    # Section headers: null, .hash, .dynsym, .dynstr, .dynamic, .shstrtab.
    def shdr(i: int, stype: int, flags: int, off: int, sz: int, link: int, info: int, align: int,
             entsize: int) -> bytes:
        addr = off if flags & _SHF_ALLOC else 0
        return struct.pack("<IIQQQQIIQQ", name_at[i], stype, flags, addr, off, sz, link, info, align, entsize)

    shdrs = (bytes(_SHDR)
             + shdr(1, _SHT_HASH, _SHF_ALLOC, hash_off, len(hash_data), 2, 0, 8, 4)
             + shdr(2, _SHT_DYNSYM, _SHF_ALLOC, dynsym_off, len(dynsym), 3, 1, 8, _SYM)
             + shdr(3, _SHT_STRTAB, _SHF_ALLOC, dynstr_off, len(dynstr), 0, 0, 1, 0)
             + shdr(4, _SHT_DYNAMIC, _SHF_ALLOC | _SHF_WRITE, dynamic_off, len(dynamic), 3, 0, 8, _DYN)
             + shdr(5, _SHT_STRTAB, 0, shstrtab_off, len(shstrtab), 0, 0, 1, 0))

    # Assemble, zero-padding up to each aligned offset.
    out = bytearray()
    for off, blob in ((0, ehdr), (_EHDR, phdrs), (hash_off, hash_data), (dynsym_off, dynsym),
                      (dynstr_off, dynstr), (dynamic_off, dynamic), (shstrtab_off, shstrtab),
                      (shoff, shdrs)):
        out += bytes(off - len(out)) + blob
    assert len(out) == size
    return bytes(out)


def write_shared_object(path: str | os.PathLike, soname: str, *, machine: str = DEFAULT_MACHINE,
                        mode: int = 0o755) -> None:
    """Atomically write a shared object to ``path``."""
    write_atomic(path, shared_object_bytes(soname, machine=machine), mode=mode)
