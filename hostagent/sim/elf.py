"""Minimal, real ELF shared objects for simulated driver libraries.

The generated file is a valid little-endian ET_DYN object with no code: one PT_LOAD
segment mapping the whole file, a PT_DYNAMIC carrying DT_SONAME, a SysV hash table, a
symbol table holding only the null symbol, and section headers. ELF64 for x86_64 and
aarch64, ELF32 for i386 (the driver's 32-bit compatibility libraries). readelf, ldconfig
and glibc's ld.so (ctypes.CDLL) accept them.
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass

from ..driver.elf import (_DT_HASH, _DT_NULL, _DT_SONAME, _DT_STRSZ, _DT_STRTAB, _DT_SYMENT,
                          _DT_SYMTAB, _PF_R, _PF_W, _PT_DYNAMIC, _PT_GNU_STACK, _PT_LOAD,
                          _SHF_ALLOC, _SHF_WRITE, _SHT_DYNAMIC, _SHT_DYNSYM, _SHT_HASH,
                          _SHT_STRTAB, read_soname)
from ..fileio import write_atomic

__all__ = ["shared_object_bytes", "write_shared_object", "read_soname", "DEFAULT_MACHINE", "MACHINES"]


@dataclass(frozen=True)
class _Class:
    """The record layouts of ELFCLASS32 or ELFCLASS64."""
    ident: int
    ehdr: struct.Struct
    phdr: struct.Struct
    shdr: struct.Struct
    dyn: struct.Struct
    sym: int
    word: int                    # alignment of the dynamic records

    def program_header(self, ptype: int, flags: int, off: int, size: int, align: int) -> bytes:
        if self.ident == 2:      # p_flags follows p_type in ELF64, p_memsz in ELF32
            return self.phdr.pack(ptype, flags, off, off, off, size, size, align)
        return self.phdr.pack(ptype, off, off, off, size, size, flags, align)


_ELF64 = _Class(2, struct.Struct("<4sBBBBB7xHHIQQQIHHHHHH"), struct.Struct("<IIQQQQQQ"),
                struct.Struct("<IIQQQQIIQQ"), struct.Struct("<qQ"), 24, 8)
_ELF32 = _Class(1, struct.Struct("<4sBBBBB7xHHIIIIIHHHHHH"), struct.Struct("<IIIIIIII"),
                struct.Struct("<IIIIIIIIII"), struct.Struct("<iI"), 16, 4)
MACHINES = {"x86_64": (62, _ELF64), "aarch64": (183, _ELF64), "i386": (3, _ELF32)}  # EM_*
_HOST_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
DEFAULT_MACHINE = _HOST_ALIASES.get(platform.machine().lower(), "x86_64")


def _align(n: int, a: int = 8) -> int:
    return (n + a - 1) & -a


def shared_object_bytes(soname: str, *, machine: str = DEFAULT_MACHINE) -> bytes:
    """Return the bytes of an ELF LE shared object whose DT_SONAME is ``soname``."""
    if machine not in MACHINES:
        raise ValueError(f"unsupported machine {machine!r}; supported: {', '.join(sorted(MACHINES))}")
    e_machine, cls = MACHINES[machine]
    name = soname.encode()
    if not name or b"\0" in name:
        raise ValueError("soname must be a non-empty string without NUL bytes")

    # File layout (file offset == virtual address, everything in one segment).
    nph = 3
    hash_off = cls.ehdr.size + nph * cls.phdr.size
    hash_data = struct.pack("<4I", 1, 1, 0, 0)  # nbucket=1, nchain=1, bucket[0]=chain[0]=STN_UNDEF
    dynsym_off = _align(hash_off + len(hash_data))
    dynsym = bytes(cls.sym)  # only the mandatory null symbol
    dynstr_off = dynsym_off + len(dynsym)
    dynstr = b"\0" + name + b"\0"
    dynamic_off = _align(dynstr_off + len(dynstr))
    dynamic = b"".join(cls.dyn.pack(tag, val) for tag, val in (
        (_DT_SONAME, 1), (_DT_HASH, hash_off), (_DT_STRTAB, dynstr_off), (_DT_SYMTAB, dynsym_off),
        (_DT_STRSZ, len(dynstr)), (_DT_SYMENT, cls.sym), (_DT_NULL, 0)))
    shstrtab_off = dynamic_off + len(dynamic)
    names = [b"", b".hash", b".dynsym", b".dynstr", b".dynamic", b".shstrtab"]
    shstrtab = b"\0".join(names) + b"\0"
    name_at = [shstrtab.index(b"\0" + n + b"\0") + 1 if n else 0 for n in names]
    shoff = _align(shstrtab_off + len(shstrtab))
    size = shoff + len(names) * cls.shdr.size

    # ELF header: magic, class, ELFDATA2LSB, EV_CURRENT, SysV ABI; ET_DYN.
    ehdr = cls.ehdr.pack(b"\x7fELF", cls.ident, 1, 1, 0, 0, 3, e_machine, 1, 0, cls.ehdr.size,
                         shoff, 0, cls.ehdr.size, cls.phdr.size, nph, cls.shdr.size, len(names),
                         len(names) - 1)

    # Program headers: one RW PT_LOAD for the whole file (ld.so rewrites .dynamic
    # in place), PT_DYNAMIC, and PT_GNU_STACK so the stack stays non-executable.
    phdrs = (cls.program_header(_PT_LOAD, _PF_R | _PF_W, 0, size, 0x10000)
             + cls.program_header(_PT_DYNAMIC, _PF_R | _PF_W, dynamic_off, len(dynamic), cls.word)
             + cls.program_header(_PT_GNU_STACK, _PF_R | _PF_W, 0, 0, 16))

    # Section headers: null, .hash, .dynsym, .dynstr, .dynamic, .shstrtab.
    def shdr(i: int, stype: int, flags: int, off: int, sz: int, link: int, info: int, align: int,
             entsize: int) -> bytes:
        addr = off if flags & _SHF_ALLOC else 0
        return cls.shdr.pack(name_at[i], stype, flags, addr, off, sz, link, info, align, entsize)

    shdrs = (bytes(cls.shdr.size)
             + shdr(1, _SHT_HASH, _SHF_ALLOC, hash_off, len(hash_data), 2, 0, cls.word, 4)
             + shdr(2, _SHT_DYNSYM, _SHF_ALLOC, dynsym_off, len(dynsym), 3, 1, cls.word, cls.sym)
             + shdr(3, _SHT_STRTAB, _SHF_ALLOC, dynstr_off, len(dynstr), 0, 0, 1, 0)
             + shdr(4, _SHT_DYNAMIC, _SHF_ALLOC | _SHF_WRITE, dynamic_off, len(dynamic), 3, 0,
                    cls.word, cls.dyn.size)
             + shdr(5, _SHT_STRTAB, 0, shstrtab_off, len(shstrtab), 0, 0, 1, 0))

    # Assemble, zero-padding up to each aligned offset.
    out = bytearray()
    for off, blob in ((0, ehdr), (cls.ehdr.size, phdrs), (hash_off, hash_data), (dynsym_off, dynsym),
                      (dynstr_off, dynstr), (dynamic_off, dynamic), (shstrtab_off, shstrtab),
                      (shoff, shdrs)):
        out += bytes(off - len(out)) + blob
    assert len(out) == size
    return bytes(out)


def write_shared_object(path: str | os.PathLike, soname: str, *, machine: str = DEFAULT_MACHINE,
                        mode: int = 0o755) -> None:
    """Atomically write a shared object to ``path``."""
    write_atomic(path, shared_object_bytes(soname, machine=machine), mode=mode)
