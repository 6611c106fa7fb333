"""The linker cache file and the ELF facts the hook writes it from: glibc's format read and
written (the host's own ldconfig -p is the reader that judges), damaged or hostile input
refused without an exception, and SONAME and flags as ldconfig reads them."""

import functools
import os
import shutil
import struct
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostagent.hooks import cachefile, elfso
from hostagent.sim.elf import shared_object_bytes

HOST_CACHE = "/etc/ld.so.cache"
LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
X86_64 = elfso.HOST_FLAGS.get(62)
needs_x86_64 = pytest.mark.skipif(X86_64 is None, reason="the ELF cases are written for an x86-64 host")


def listing(path) -> list[str]:
    """``ldconfig -p`` of a cache file: its entries, without the count and generator lines."""
    if not os.path.exists(LDCONFIG):
        pytest.skip("no ldconfig on this host to read caches with")
    out = subprocess.run([LDCONFIG, "-p", "-C", str(path)], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("\t")]


def entry(soname: bytes, folder: bytes = b"/usr/lib/x86_64-linux-gnu", flags: int = 0x0303, hwcap: int = 0):
    return (soname, folder + b"/" + soname, flags, 0, hwcap)


def sample() -> cachefile.Cache:
    names = [b"libcuda.so.1", b"libcuda.so", b"libnvidia-ml.so.1", b"libz.so.1", b"libc.so.6", b"libfoo.so.10",
             b"libfoo.so.9"]
    cache = cachefile.merge(cachefile.Cache([], []), [entry(n) for n in names])
    return cache


def test_the_hosts_own_cache_reads_and_renders_back_to_the_same_listing(tmp_path):
    if not os.path.exists(HOST_CACHE):
        pytest.skip("this host has no /etc/ld.so.cache")
    with open(HOST_CACHE, "rb") as f:
        cache = cachefile.parse(f.read())
    assert cache is not None and cache.entries
    copy = tmp_path / "ld.so.cache"
    copy.write_bytes(cachefile.render(cache))
    assert listing(copy) == listing(HOST_CACHE)


def test_a_rendered_cache_is_read_by_ldconfig_in_order_and_parses_back(tmp_path):
    cache = sample()
    data = cachefile.render(cache)
    (tmp_path / "c").write_bytes(data)
    assert listing(tmp_path / "c") == [f"\t{k.decode()} (libc6,x86-64) => {p.decode()}" for k, p, *_ in cache.entries]
    # ldconfig's order: keys descending, numbers as numbers (10 after 9, .so.1 after .so)
    assert [e[0] for e in cache.entries] == [b"libz.so.1", b"libnvidia-ml.so.1", b"libfoo.so.10", b"libfoo.so.9",
                                             b"libcuda.so.1", b"libcuda.so", b"libc.so.6"]
    again = cachefile.parse(data)
    assert again.entries == cache.entries and cachefile.render(again) == data


def test_the_older_layout_with_the_old_table_first_is_read_too():
    cache = sample()
    new = bytearray(cachefile.render(cache))
    struct.pack_into("<I", new, 32, 0)                       # ldconfig before 2.33 wrote no extension
    count = 3
    old = cachefile.OLD_MAGIC + b"\0" + struct.pack("<I", count) + bytes(12 * count)
    old += bytes(-len(old) % 8)
    assert cachefile.parse(old + bytes(new)).entries == cache.entries


def test_glibc_hwcaps_entries_keep_their_subdirectory():
    cache = cachefile.Cache([entry(b"libz.so.1", b"/usr/lib/glibc-hwcaps/x86-64-v3", hwcap=cachefile.HWCAP_EXTENSION),
                             entry(b"libz.so.1", b"/usr/lib")], [b"x86-64-v3"])
    again = cachefile.parse(cachefile.render(cache))
    assert again.entries == cache.entries and again.hwcaps == [b"x86-64-v3"]


@pytest.mark.parametrize("damage", ["truncated-header", "too-many-entries", "key-past-the-end", "no-terminator",
                                    "big-endian", "old-table-alone", "hwcap-without-names", "too-large", "garbage"])
def test_a_cache_that_cannot_be_rewritten_faithfully_is_refused(damage):
    data = bytearray(cachefile.render(sample()))
    strings_end = struct.unpack_from("<I", data, 32)[0]          # the extension follows the strings
    if damage == "truncated-header":
        data = data[:40]
    elif damage == "too-many-entries":
        struct.pack_into("<I", data, 20, 10_000)
    elif damage == "key-past-the-end":
        struct.pack_into("<I", data, 48 + 4, len(data) + 10)
    elif damage == "no-terminator":
        data = data[:strings_end - 4]                         # the last string loses its NUL (and the extension)
        struct.pack_into("<I", data, 32, 0)
    elif damage == "big-endian":
        data[28] = 3
    elif damage == "old-table-alone":
        data = bytearray(cachefile.OLD_MAGIC + b"\0" + struct.pack("<I", 1) + bytes(12)
                         + b"libz.so.1\0/lib/libz.so.1\0")
    elif damage == "hwcap-without-names":
        struct.pack_into("<Q", data, 48 + 16, cachefile.HWCAP_EXTENSION | 5)
    elif damage == "too-large":
        data += bytes(cachefile.MAX_BYTES)
    else:
        data = bytearray(os.urandom(300))
    assert cachefile.parse(bytes(data)) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mangled_caches_are_read_or_refused_never_an_exception(data):
    raw = bytearray(cachefile.render(sample()))
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    raw = raw[:data.draw(st.integers(0, len(raw)))]
    cache = cachefile.parse(bytes(raw))
    if cache is not None:
        merged = cachefile.merge(cache, [entry(b"libcuda.so.1")]) or cache
        cachefile.parse(cachefile.render(merged))


def test_added_entries_go_before_their_ties_in_the_order_given_and_replace_duplicates():
    image = cachefile.merge(cachefile.Cache([], []), [entry(b"libcuda.so.1", b"/usr/local/cuda/compat"),
                                                      entry(b"libz.so.1", b"/lib")])
    first, second = entry(b"libcuda.so.1", b"/usr/lib/x86_64-linux-gnu"), entry(b"libcuda.so.1", b"/opt/driver")
    merged = cachefile.merge(image, [first, second])
    assert merged.entries == [entry(b"libz.so.1", b"/lib"), first, second,
                              entry(b"libcuda.so.1", b"/usr/local/cuda/compat")]
    assert cachefile.merge(merged, [first, second]) is None                    # nothing changes: no write
    # An entry the image has in the wrong place is moved in front of its ties.
    late = cachefile.merge(image, [entry(b"libcuda.so.1", b"/usr/local/cuda/compat"), first])
    assert late.entries[1:] == [entry(b"libcuda.so.1", b"/usr/local/cuda/compat"), first]


@pytest.mark.parametrize("a, b, sign", [(b"libfoo.so.10", b"libfoo.so.9", 1), (b"libfoo.so.1", b"libfoo.so", 1),
                                        (b"lib1", b"liba", 1), (b"libfoo.so.01", b"libfoo.so.1", 0),
                                        (b"libnvidia-glcore.so.570", b"libnvidia-glsi.so.570", -1),
                                        (b"libc.so.6", b"libc.so.6", 0), (b"ld-2.36.so", b"ld-2.4.so", 1)])
def test_names_compare_as_glibc_compares_them(a, b, sign):
    result = cachefile.libcmp(a, b)
    assert (result > 0) - (result < 0) == sign
    assert (cachefile.libcmp(b, a) > 0) - (cachefile.libcmp(b, a) < 0) == -sign


@given(st.lists(st.text("ab.1290-", max_size=12).map(str.encode), min_size=2, max_size=12))
def test_the_name_order_is_a_total_order(names):
    ordered = sorted(names, key=functools.cmp_to_key(cachefile.libcmp))
    for x, y in zip(ordered, ordered[1:]):
        assert cachefile.libcmp(x, y) <= 0 and cachefile.libcmp(y, x) >= 0


# -- ELF ---------------------------------------------------------------------------------

def elf_facts(tmp_path, data: bytes):
    path = tmp_path / "lib"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return elfso.read(fd, len(data))
    finally:
        os.close(fd)


def retagged(data: bytes, old_tag: int, new_tag: int) -> bytes:
    """``data`` with the first dynamic entry tagged ``old_tag`` tagged ``new_tag``."""
    phoff, = struct.unpack_from("<Q", data, 32)
    phnum, = struct.unpack_from("<H", data, 56)
    for i in range(phnum):
        ptype, _, offset, _, _, size, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + 56 * i)
        if ptype == 2:
            for at in range(offset, offset + size, 16):
                if struct.unpack_from("<q", data, at)[0] == old_tag:
                    out = bytearray(data)
                    struct.pack_into("<q", out, at, new_tag)
                    return bytes(out)
    raise AssertionError("no such tag")


@needs_x86_64
def test_the_soname_and_flags_ldconfig_reads(tmp_path):
    assert elf_facts(tmp_path, shared_object_bytes("libcuda.so.1")) == (b"libcuda.so.1", 0x0303)
    assert elf_facts(tmp_path, retagged(shared_object_bytes("libx.so.1"), 14, 21)) == (None, 0x0303)   # no DT_SONAME
    executable = bytearray(shared_object_bytes("libx.so.1"))
    executable[16] = 2                                                           # ET_EXEC
    assert elf_facts(tmp_path, bytes(executable)) is None
    assert elf_facts(tmp_path, retagged(shared_object_bytes("libx.so.1"), 5, 21)) is None              # no DT_STRTAB
    assert elf_facts(tmp_path, b"/* GNU ld script */ GROUP ( libc.so.6 )") is None
    assert elf_facts(tmp_path, shared_object_bytes("libx.so.1")[:100]) is None                          # truncated
    for machine in ("i386", "aarch64"):                                          # left to ldconfig
        with pytest.raises(elfso.Unsupported):
            elf_facts(tmp_path, shared_object_bytes("libx.so.1", machine=machine))


@needs_x86_64
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mangled_libraries_are_read_skipped_or_left_to_ldconfig_never_an_exception(tmp_path, data):
    raw = bytearray(shared_object_bytes("libnvidia-ml.so.1"))
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    try:
        facts = elf_facts(tmp_path, bytes(raw[:data.draw(st.integers(0, len(raw)))]))
    except elfso.Unsupported:
        return
    assert facts is None or (isinstance(facts[0], (bytes, type(None))) and facts[1] == X86_64)
