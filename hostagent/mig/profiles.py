"""MIG profile names and compute-instance shapes.

Names follow mig-parted's grammar (go-nvlib ``mig_profile.go``):
``[<C>c.]<G>g.<GB>gb[+attr[,attr]|-attr]`` with attributes ``me``, ``me.all``, ``gfx`` and the
negative ``-me``. Parsing checks form only; whether a GPU has the profile is the planner's
question, answered per GPU from that GPU's own profile table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProfileName", "parse_profile", "ci_shapes", "CiShape", "ci_name"]


@dataclass(frozen=True)
class ProfileName:
    c: int
    g: int
    gb: int
    attrs: tuple[str, ...] = ()      # sorted; "+" attributes
    negative: str = ""               # "me" for "-me"

    @property
    def suffix(self) -> str:
        if self.negative:
            return f"-{self.negative}"
        return "+" + ",".join(self.attrs) if self.attrs else ""

    @property
    def gi_name(self) -> str:
        """The GPU-instance profile this names, as the inventory spells it."""
        return f"{self.g}g.{self.gb}gb{self.suffix}"

    def __str__(self) -> str:
        """Canonical form: the ``<C>c.`` part only when it differs from G."""
        return self.gi_name if self.c == self.g else f"{self.c}c.{self.gi_name}"


def _field(text: str, unit: str) -> int:
    if text.strip() != text:
        raise ValueError(f"leading or trailing spaces on '%d{unit}'")
    if not text.endswith(unit):
        raise ValueError(f"missing '{unit}' from '%d{unit}'")
    number = text[:-len(unit)]
    if not (number.isascii() and number.isdigit()) or int(number) == 0:
        raise ValueError(f"malformed number in '%d{unit}'")
    return int(number)


def _attributes(text: str) -> tuple[str, ...]:
    attrs = text.split(",")
    seen = set()
    for a in attrs:
        if a in seen:
            raise ValueError("non unique attribute in list")
        if a == "":
            raise ValueError("empty attribute in list")
        if a.strip() != a:
            raise ValueError("leading or trailing spaces in attribute")
        if a[0].isdigit():
            raise ValueError("attribute begins with a number")
        # go-nvlib allows letters and digits; "." is needed for "me.all".
        if not all(ch.isascii() and (ch.isalnum() or ch == ".") for ch in a):
            raise ValueError("non alpha-numeric character or digit in attribute")
        seen.add(a)
    return tuple(sorted(attrs))


def parse_profile(text: str) -> ProfileName:
    """Parse a profile name; ValueError carries go-nvlib's wording for malformed names."""
    if not isinstance(text, str) or text == "":
        raise ValueError("profile is the empty string")
    attrs: tuple[str, ...] = ()
    negative = ""
    head, plus, tail = text.partition("+")
    if not plus:
        head, minus, tail = text.partition("-")
        if minus:
            if tail != "me":
                raise ValueError(f"cannot parse attributes of '{text}': only '-me' may be negated")
            negative = tail
    else:
        try:
            attrs = _attributes(tail)
        except ValueError as e:
            raise ValueError(f"cannot parse attributes of '{text}': {e}") from None
    try:
        parts = head.split(".", 2)
        if len(parts) == 3:
            c, g, gb = _field(parts[0], "c"), _field(parts[1], "g"), _field(parts[2], "gb")
        elif len(parts) == 2:
            g, gb = _field(parts[0], "g"), _field(parts[1], "gb")
            c = g
        else:
            raise ValueError("parsed wrong number of fields, expected 2 or 3")
    except ValueError as e:
        raise ValueError(f"cannot parse fields of '{text}': {e}") from None
    return ProfileName(c=c, g=g, gb=gb, attrs=attrs, negative=negative)


def ci_name(ci_slices: int, gi_slices: int, gi_profile: str) -> str:
    return gi_profile if ci_slices == gi_slices else f"{ci_slices}c.{gi_profile}"


# NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE values by slice count; nvidia-smi's CI ids equal them.
_CI_PROFILE_ID = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


@dataclass(frozen=True)
class CiShape:
    profile_id: int
    slices: int
    starts: tuple[int, ...]         # placements on the GPU instance's compute-slice axis


def ci_shapes(gi_slices: int) -> tuple[CiShape, ...]:
    """Compute-instance profiles a G-slice GPU instance offers.

    NVML lists them only for an existing GPU instance, but the planner must know them
    before creating one, so this is the published rule (mig.md 3.9): C slices fit when
    C == G or 2C <= G+1, G // C of them, packed from slice 0.
    """
    return tuple(CiShape(_CI_PROFILE_ID[c], c, tuple(k * c for k in range(gi_slices // c)))
                 for c in sorted(_CI_PROFILE_ID)
                 if c <= gi_slices and (c == gi_slices or 2 * c <= gi_slices + 1))
