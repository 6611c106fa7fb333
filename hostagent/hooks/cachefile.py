"""The dynamic loader's cache file, ``/etc/ld.so.cache``: read an image's, write a new one.

The layout is glibc's (``elf/cache.c``, ``sysdeps/generic/dl-cache.h``), little-endian only:

* a 48-byte header: ``glibc-ld.so.cache1.1``, the entry count, the string table's size, a
  flags byte (the byte order: 0 unset, 2 little), the extension directory's offset;
* 24 bytes per entry: flags (kind and ABI, 0x0303 is libc6 x86-64), the offsets of the key
  (the SONAME) and of the value (the path), the required OS version, the hwcap word (bit 62
  set: the low 32 bits index the glibc-hwcaps subdirectory names);
* the string table; the extension directory (magic 0xEAA42174, then tag, flags, offset and
  size per section: 0 the generator's name, 1 the glibc-hwcaps names' string offsets).

Caches before glibc 2.32 put an older table first ("ld.so-1.7.0") and this one after it; its
string offsets count from its own start. Entries are sorted the way ldconfig sorts them
(``compare``): the loader binary-searches them by key.

The image controls the file it reads: every count and offset is bounded by the data, and
anything this module cannot rewrite faithfully makes ``parse`` return None.
"""

import struct

__all__ = ["Entry", "Cache", "parse", "render", "merge", "compare", "MAX_BYTES"]

MAX_BYTES = 1 << 20                      # about 25,000 entries; real ones are tens of kB
MAGIC = b"glibc-ld.so.cache1.1"
OLD_MAGIC = b"ld.so-1.7.0"
_HEADER = struct.Struct("<20sIIB3xI12x")
_ENTRY = struct.Struct("<iIIIQ")
_EXTENSION = struct.Struct("<II")
_SECTION = struct.Struct("<IIII")
_EXTENSION_MAGIC = 0xEAA42174
_TAG_GENERATOR, _TAG_HWCAPS = 0, 1
_ENDIAN_UNSET, _ENDIAN_LITTLE = 0, 2
HWCAP_EXTENSION = 1 << 62
GENERATOR = b"hostagent-hook: the image's cache and the injected driver libraries"


# An entry: (key, path, flags, osversion, hwcap), key and path as bytes.
Entry = tuple


class Cache:
    """The entries in file order and the glibc-hwcaps subdirectory names they index."""

    __slots__ = ("entries", "hwcaps")

    def __init__(self, entries: list[Entry], hwcaps: list[bytes]):
        self.entries, self.hwcaps = entries, hwcaps


def parse(data: bytes) -> Cache | None:
    """The cache in ``data``, or None when it is not one this module can rewrite as it is
    (damaged, another byte order, the old table alone, too large)."""
    if len(data) > MAX_BYTES:
        return None
    base = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < 16:
            return None
        count, = struct.unpack_from("<I", data, 12)
        base = (16 + 12 * count + 7) & ~7
        if base + _HEADER.size > len(data) or data[base:base + 20] != MAGIC:
            return None
    elif not data.startswith(MAGIC) or len(data) < _HEADER.size:
        return None
    _, count, _, flags, ext_offset = _HEADER.unpack_from(data, base)
    table = data[base:]                  # string offsets count from the table's header
    if flags & 3 not in (_ENDIAN_UNSET, _ENDIAN_LITTLE) or _HEADER.size + count * _ENTRY.size > len(table):
        return None
    hwcaps = _hwcaps(data, base, ext_offset) if ext_offset else []
    if hwcaps is None:
        return None
    entries = []
    try:
        for flags, key, value, osversion, hwcap in _ENTRY.iter_unpack(
                table[_HEADER.size:_HEADER.size + count * _ENTRY.size]):
            if hwcap & HWCAP_EXTENSION and (hwcap & 0xFFFFFFFF) >= len(hwcaps):
                return None
            entries.append((_string(table, key), _string(table, value), flags, osversion, hwcap))
    except ValueError:
        return None
    return Cache(entries, hwcaps)


def _string(table: bytes, offset: int) -> bytes:
    end = table.index(b"\0", offset)     # ValueError past the end
    return table[offset:end]


def _hwcaps(data: bytes, base: int, offset: int) -> list[bytes] | None:
    """The glibc-hwcaps names of the extension directory at file offset ``offset``; None
    when the directory is damaged, or is in a cache that also has the old table."""
    if base or offset % 4 or offset + _EXTENSION.size > len(data):
        return None
    magic, count = _EXTENSION.unpack_from(data, offset)
    if magic != _EXTENSION_MAGIC or offset + _EXTENSION.size + count * _SECTION.size > len(data):
        return None
    names: list[bytes] = []
    try:
        for i in range(count):
            tag, _, start, size = _SECTION.unpack_from(data, offset + _EXTENSION.size + i * _SECTION.size)
            if tag != _TAG_HWCAPS:
                continue
            if size % 4 or start + size > len(data):
                return None
            names = [_string(data, at) for (at,) in struct.iter_unpack("<I", data[start:start + size])]
    except ValueError:
        return None
    return names


def render(cache: Cache) -> bytes:
    """The file for ``cache``, laid out as ldconfig lays out its new format (a path's
    final name doubles as the key where they match)."""
    strings = bytearray()
    at: dict[bytes, int] = {}

    def intern(s: bytes) -> int:
        if s not in at:
            at[s] = len(strings)
            strings.extend(s + b"\0")
        return at[s]

    start = _HEADER.size + len(cache.entries) * _ENTRY.size
    rows = []
    for key, path, flags, osversion, hwcap in cache.entries:
        value = intern(path)
        if path.endswith(b"/" + key):
            where = value + len(path) - len(key)
        else:
            where = intern(key)
        rows.append(_ENTRY.pack(flags, start + where, start + value, osversion, hwcap))
    names = [start + intern(name) for name in cache.hwcaps]
    ext_offset = (start + len(strings) + 3) & ~3
    sections = 2 if names else 1
    after = ext_offset + _EXTENSION.size + sections * _SECTION.size
    directory = _EXTENSION.pack(_EXTENSION_MAGIC, sections)
    directory += _SECTION.pack(_TAG_GENERATOR, 0, after + 4 * len(names), len(GENERATOR))
    if names:
        directory += _SECTION.pack(_TAG_HWCAPS, 0, after, 4 * len(names))
    header = _HEADER.pack(MAGIC, len(cache.entries), len(strings), _ENDIAN_LITTLE, ext_offset)
    return b"".join((header, *rows, strings, bytes(ext_offset - start - len(strings)), directory,
                     struct.pack(f"<{len(names)}I", *names), GENERATOR))


def merge(cache: Cache, added: list[Entry]) -> Cache | None:
    """``cache`` with the ``added`` entries in their sorted places, each before the entries
    it ties with and in the order given (ldconfig scans the folders named on its command
    line first, in order), exact duplicates of them dropped; None when nothing changes."""
    mine = dict.fromkeys(added)
    entries = [e for e in cache.entries if e not in mine]
    for entry in reversed(mine):          # each goes before its ties: last one first
        lo, hi = 0, len(entries)
        while lo < hi:                     # the first entry sorting at or after this one
            mid = (lo + hi) // 2
            if compare(entries[mid], entry, cache.hwcaps) < 0:
                lo = mid + 1
            else:
                hi = mid
        entries.insert(lo, entry)
    return None if entries == cache.entries else Cache(entries, cache.hwcaps)


def compare(a: Entry, b: Entry, hwcaps: list[bytes] = ()) -> int:
    """ldconfig's order (elf/cache.c ``compare``): keys descending by ``libcmp``, then
    higher flags, glibc-hwcaps entries first (by subdirectory name), more hwcap bits, a
    higher hwcap and a higher OS version first."""
    res = libcmp(b[0], a[0])
    if res:
        return res
    if a[2] != b[2]:
        return 1 if a[2] < b[2] else -1
    ext_a, ext_b = a[4] & HWCAP_EXTENSION, b[4] & HWCAP_EXTENSION
    if ext_a != ext_b:
        return -1 if ext_a else 1
    if ext_a:
        name_a, name_b = hwcaps[a[4] & 0xFFFFFFFF], hwcaps[b[4] & 0xFFFFFFFF]
        if name_a != name_b:
            return -1 if name_a < name_b else 1
    else:
        bits_a, bits_b = a[4].bit_count(), b[4].bit_count()
        if bits_a != bits_b:
            return 1 if bits_b > bits_a else -1
        if a[4] != b[4]:
            return 1 if b[4] > a[4] else -1
    if a[3] != b[3]:
        return 1 if b[3] > a[3] else -1
    return 0


def libcmp(a: bytes, b: bytes) -> int:
    """glibc's ``_dl_cache_libcmp``: runs of digits compare as numbers, and a digit sorts
    after any other character."""
    if a == b:
        return 0
    # Skip the common prefix in one step, back to the start of a run of digits it ends in.
    n = min(len(a), len(b))
    diff = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
    i = n - 1 - (diff.bit_length() - 1) // 8 if diff else n
    while i and 48 <= a[i - 1] <= 57:
        i -= 1
    j = i
    while i < len(a):
        x = a[i]
        y = b[j] if j < len(b) else 0
        if 48 <= x <= 57:
            if not 48 <= y <= 57:
                return 1
            i0, j0 = i, j
            while i < len(a) and 48 <= a[i] <= 57:
                i += 1
            while j < len(b) and 48 <= b[j] <= 57:
                j += 1
            va, vb = int(a[i0:i]), int(b[j0:j])
            if va != vb:
                return va - vb
        elif 48 <= y <= 57:
            return -1
        elif x != y:
            return x - y
        else:
            i += 1
            j += 1
    return -(b[j] if j < len(b) else 0)
