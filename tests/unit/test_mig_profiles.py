"""MIG profile names (mig-parted's grammar) and compute-instance shapes."""

import pytest

from hostagent.mig.profiles import ci_shapes, parse_profile


@pytest.mark.parametrize("text, canonical, parts", [
    ("1g.5gb", "1g.5gb", (1, 1, 5, (), "")),
    ("3c.3g.20gb", "3g.20gb", (3, 3, 20, (), "")),          # C == G drops the c part
    ("1c.3g.20gb", "1c.3g.20gb", (1, 3, 20, (), "")),
    ("1g.5gb+me", "1g.5gb+me", (1, 1, 5, ("me",), "")),
    ("1g.24gb+me.all", "1g.24gb+me.all", (1, 1, 24, ("me.all",), "")),
    ("1g.24gb-me", "1g.24gb-me", (1, 1, 24, (), "me")),
    ("2g.20gb+me,gfx", "2g.20gb+gfx,me", (2, 2, 20, ("gfx", "me"), "")),   # attribute order normalised
    ("1c.2g.10gb+me", "1c.2g.10gb+me", (1, 2, 10, ("me",), "")),
])
def test_well_formed_names(text, canonical, parts):
    p = parse_profile(text)
    assert (p.c, p.g, p.gb, p.attrs, p.negative) == parts
    assert str(p) == canonical
    assert p.gi_name == canonical.split("c.", 1)[-1]        # the GPU-instance profile it names


@pytest.mark.parametrize("text, message", [
    ("", "profile is the empty string"),
    ("1g", "parsed wrong number of fields, expected 2 or 3"),
    ("1x.5gb", "missing 'g' from '%dg'"),
    ("1g.5", "missing 'gb' from '%dgb'"),
    ("ag.5gb", "malformed number in '%dg'"),
    ("0g.5gb", "malformed number in '%dg'"),
    (" 1g.5gb", "leading or trailing spaces on '%dg'"),
    ("1c.1g.5gb.x", "missing 'gb' from '%dgb'"),
    ("1g.5gb+", "empty attribute in list"),
    ("1g.5gb+me,me", "non unique attribute in list"),
    ("1g.5gb+ me", "leading or trailing spaces in attribute"),
    ("1g.5gb+1me", "attribute begins with a number"),
    ("1g.5gb+m@", "non alpha-numeric character or digit in attribute"),
    ("1g.5gb-gfx", "only '-me' may be negated"),
])
def test_malformed_names_get_mig_parted_messages(text, message):
    with pytest.raises(ValueError) as e:
        parse_profile(text)
    assert message in str(e.value)


def test_compute_instance_shapes_follow_the_published_table():
    # mig.md 3.9: allowed CIs per GI with their maxima.
    table = {g: {s.slices: len(s.starts) for s in ci_shapes(g)} for g in (1, 2, 3, 4, 7)}
    assert table == {1: {1: 1}, 2: {1: 2, 2: 1}, 3: {1: 3, 2: 1, 3: 1}, 4: {1: 4, 2: 2, 4: 1},
                     7: {1: 7, 2: 3, 3: 2, 4: 1, 7: 1}}
    assert [s.profile_id for s in ci_shapes(7)] == [0, 1, 2, 3, 4]     # NVML CI profile ids
    assert ci_shapes(7)[1].starts == (0, 2, 4)
