"""Tests for hostagent.sim.elf: generated fake driver libraries are real ELF objects."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from hostagent.sim.elf import DEFAULT_MACHINE, read_soname, shared_object_bytes, write_shared_object

SONAMES = ["libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libfoo.so", "x"]
IS_X86_64_LINUX = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")
E_MACHINE = struct.Struct("<H")  # e_machine lives at offset 18


def _readelf(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("readelf")
    if exe is None:
        pytest.skip("readelf (binutils) is not installed")
    return subprocess.run([exe, "-W", *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("soname", SONAMES)
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_soname_round_trip(tmp_path, soname, machine):
    path = tmp_path / "lib.so"
    write_shared_object(path, soname, machine=machine)
    assert read_soname(path) == soname


def test_deterministic_and_default_machine():
    assert shared_object_bytes("libcuda.so.1") == shared_object_bytes("libcuda.so.1")
    assert shared_object_bytes("libcuda.so.1") == shared_object_bytes("libcuda.so.1", machine=DEFAULT_MACHINE)
    assert shared_object_bytes("libcuda.so.1") != shared_object_bytes("libcuda.so.2")
    assert DEFAULT_MACHINE in ("x86_64", "aarch64")


@pytest.mark.parametrize("machine, e_machine", [("x86_64", 62), ("aarch64", 183)])
def test_header_machine(machine, e_machine):
    data = shared_object_bytes("libcuda.so.1", machine=machine)
    assert data[:6] == b"\x7fELF\x02\x01"  # ELF64, little-endian
    assert struct.unpack_from("<H", data, 16)[0] == 3  # ET_DYN
    assert E_MACHINE.unpack_from(data, 18)[0] == e_machine


def test_i386_objects_are_elf32():
    data = shared_object_bytes("libcuda.so.1", machine="i386")
    assert data[:6] == b"\x7fELF\x01\x01"  # ELF32, little-endian
    assert struct.unpack_from("<HH", data, 16) == (3, 3)  # ET_DYN, EM_386
    assert struct.unpack_from("<H", data, 40)[0] == 52     # e_ehsize of ELF32


@pytest.mark.parametrize("machine", ["x86_64", "aarch64", "i386"])
def test_readelf_accepts_it(tmp_path, machine):
    path = tmp_path / "libcuda.so.535.104.05"
    write_shared_object(path, "libcuda.so.1", machine=machine)
    dyn = _readelf("-d", str(path))
    assert dyn.returncode == 0, dyn.stderr
    assert re.search(r"\(SONAME\)\s+Library soname: \[libcuda\.so\.1\]", dyn.stdout), dyn.stdout
    full = _readelf("-h", "-l", "-S", "--dyn-syms", str(path))
    assert full.returncode == 0
    assert full.stderr == "", full.stderr
    assert {"aarch64": "AArch64", "x86_64": "X86-64", "i386": "Intel 80386"}[machine] in full.stdout


@pytest.mark.skipif(not IS_X86_64_LINUX, reason="dlopen test needs an x86_64 Linux host")
def test_ctypes_loads_it(tmp_path):
    path = tmp_path / "libnvidia-ml.so.535.104.05"
    write_shared_object(path, "libnvidia-ml.so.1", machine="x86_64")
    lib = ctypes.CDLL(str(path))
    assert lib._handle


@pytest.mark.skipif(shutil.which("ldconfig") is None, reason="ldconfig is not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="ldconfig test runs only as root")
def test_ldconfig_creates_soname_symlink(tmp_path):
    write_shared_object(tmp_path / "libfoo.so.535.1", "libfoo.so.1")
    subprocess.run([shutil.which("ldconfig"), "-n", str(tmp_path)], check=True, capture_output=True)
    link = tmp_path / "libfoo.so.1"
    assert link.is_symlink()
    assert os.readlink(link) == "libfoo.so.535.1"


def test_write_is_atomic_and_sets_mode(tmp_path):
    path = tmp_path / "libcuda.so.535.1"
    path.write_bytes(b"old contents")
    write_shared_object(path, "libcuda.so.1", mode=0o640)
    assert os.listdir(tmp_path) == ["libcuda.so.535.1"]
    assert (path.stat().st_mode & 0o7777) == 0o640
    assert path.read_bytes() == shared_object_bytes("libcuda.so.1")
    write_shared_object(path, "libcuda.so.1")
    assert (path.stat().st_mode & 0o7777) == 0o755


def test_write_failure_leaves_no_temp_file(tmp_path):
    with pytest.raises(ValueError):
        write_shared_object(tmp_path / "libx.so", "libx.so", machine="sparc")
    with pytest.raises(IsADirectoryError):
        (tmp_path / "dir").mkdir()
        write_shared_object(tmp_path / "dir", "libx.so")
    assert os.listdir(tmp_path) == ["dir"]


def test_unknown_machine_is_rejected():
    with pytest.raises(ValueError, match="aarch64.*x86_64"):
        shared_object_bytes("libcuda.so.1", machine="ppc64le")


@pytest.mark.parametrize("bad", ["", "lib\0x.so"])
def test_bad_soname_is_rejected(bad):
    with pytest.raises(ValueError):
        shared_object_bytes(bad)


@pytest.mark.parametrize("content", [
    b"",
    b"#!/bin/sh\necho not an ELF\n",
    b"\x7fELF",
    b"\x7fELF\x01\x01\x01" + bytes(57),  # ELF32 header
])
def test_read_soname_rejects_non_elf(tmp_path, content):
    path = tmp_path / "f"
    path.write_bytes(content)
    assert read_soname(path) is None


@pytest.mark.parametrize("where", ["header", "phdrs", "dynstr", "dynamic"])
def test_read_soname_truncated(tmp_path, where):
    data = shared_object_bytes("libcuda.so.1", machine="x86_64")
    dyn_off = struct.unpack_from("<Q", data, 64 + 56 + 8)[0]  # p_offset of PT_DYNAMIC
    cut = {"header": 40, "phdrs": 64 + 60, "dynstr": data.index(b"libcuda") + 4, "dynamic": dyn_off + 24}[where]
    path = tmp_path / "f"
    path.write_bytes(data[:cut])
    assert read_soname(path) is None


def test_read_soname_without_soname(tmp_path):
    data = bytearray(shared_object_bytes("libcuda.so.1", machine="x86_64"))
    dyn_off = struct.unpack_from("<Q", data, 64 + 56 + 8)[0]  # p_offset of PT_DYNAMIC
    struct.pack_into("<q", data, dyn_off, 0x7FFFFFFF)  # overwrite the DT_SONAME tag
    path = tmp_path / "f"
    path.write_bytes(bytes(data))
    assert read_soname(path) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.booleans())
def test_read_soname_never_raises_on_random_bytes(blob, elf_prefix):
    if elf_prefix:  # make the header check pass so the deeper parsing gets exercised
        blob = b"\x7fELF\x02\x01" + blob
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f")
        with open(path, "wb") as f:
            f.write(blob)
        result = read_soname(path)
    assert result is None or isinstance(result, str)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=831), st.integers(min_value=0, max_value=255))
def test_read_soname_never_raises_on_corrupted_object(pos, byte):
    data = bytearray(shared_object_bytes("libcuda.so.1", machine="x86_64"))
    data[pos] = byte
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f")
        with open(path, "wb") as f:
            f.write(data)
        result = read_soname(path)
    assert result is None or isinstance(result, str)
