"""Allocation ids to spec file and device names: one id, one name, and every name one CDI
accepts (so no caller's id can take another's file, as ``a_b`` took ``a/b``'s)."""

import re

from hypothesis import given, strategies as st

from hostagent.cdi.transient import MAX_SAFE_ID, safe_id, spec_file_name
from hostagent.fileio import temp_path
from hostagent.daemon.allocations import ID_PATTERN

IDS = st.from_regex(ID_PATTERN, fullmatch=True)
CDI_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def unescape(name: str) -> str:
    out, i = [], 0
    while i < len(name):
        if name[i] == "." and name[i + 1:i + 2] in (".", "_"):
            out.append(name[i + 1])
            i += 2
        else:
            out.append("/" if name[i] == "_" else name[i])
            i += 1
    return "".join(out)


@given(IDS)
def test_the_name_says_which_id_it_is(alloc_id):
    name = safe_id(alloc_id)
    assert unescape(name) == alloc_id or ".h" in name
    assert CDI_DEVICE_NAME.fullmatch(f"{name}-gpu0") and "/" not in spec_file_name(alloc_id)


# The ids whose escaped form is longest: 128 characters, nearly all of them escaped.
LONG_IDS = st.from_regex(r"^[A-Za-z0-9][._/]{100,126}[A-Za-z0-9]$", fullmatch=True)


@given(st.one_of(IDS, LONG_IDS))
def test_every_name_fits_in_a_directory_entry_with_its_temporary(alloc_id):
    """A file name, and the temporary name its atomic write uses, within NAME_MAX."""
    name = spec_file_name(alloc_id)
    assert len(safe_id(alloc_id)) <= MAX_SAFE_ID + 2
    assert len(temp_path("/", name).encode()) - 1 <= 255


@given(LONG_IDS, LONG_IDS)
def test_long_ids_never_share_a_name(a, b):
    assert (safe_id(a) == safe_id(b)) == (a == b)
    assert (safe_id(a) == safe_id(a[:40]) and a == a[:40]) or safe_id(a) != safe_id(a[:40])


@given(IDS, IDS)
def test_two_ids_never_share_a_name(a, b):
    assert (safe_id(a) == safe_id(b)) == (a == b)


def test_the_ids_that_shared_a_file_before_do_not_now():
    claim = "k8s-dra/0b7e5c1e-1f0a-4c51-9a57-28f4c1d6b2c3"
    assert safe_id(claim) == "k8s-dra_0b7e5c1e-1f0a-4c51-9a57-28f4c1d6b2c3"      # CDI's own form, unchanged
    assert safe_id("k8s-dra_0b7e5c1e-1f0a-4c51-9a57-28f4c1d6b2c3") != safe_id(claim)
    assert len({safe_id(i) for i in ("a/b", "a_b", "a._b", "a.._b", "a./b", "a//b", "a__b")}) == 7


def test_a_hashed_name_is_never_an_escaped_one():
    long = "a" + "_" * 126 + "b"
    name = safe_id(long)
    assert name.startswith("a" + "._" * 39 + ".h") and unescape(name) != long
    assert safe_id("a" + "_" * 39 + ".h" + name.rpartition(".h")[2]) != name
