"""Kubernetes quantities (``10Gi``, ``512Mi``, ``1G``, ``1.5e9``): parsed to an integer
number of units, and written back as the API server writes them."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["parse_quantity", "format_quantity", "MAX"]

MAX = 2 ** 63 - 1          # Kubernetes' int64 of a quantity's value

_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
             "m": Decimal("0.001"), "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15,
             "E": 10 ** 18, "": 1}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?)")
_BINARY = (("Ei", 2 ** 60), ("Pi", 2 ** 50), ("Ti", 2 ** 40), ("Gi", 2 ** 30), ("Mi", 2 ** 20), ("Ki", 2 ** 10))


def parse_quantity(value) -> int:
    """An integer (bytes, for a memory quantity), rounded up as Kubernetes rounds a
    quantity's value; ValueError when it is not a quantity."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if abs(value) > MAX:
            raise ValueError(f"{_shown(value)} is too large (at most {MAX}, as Kubernetes holds a quantity's value)")
        return value
    m = _QUANTITY.fullmatch(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a quantity (like 10Gi, 512Mi or 1G)")
    try:
        number = Decimal(m.group(1) + (m.group(2) or ""))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a quantity") from None
    # Bounded before it is multiplied out: "1e999999999" is a billion digits as an integer.
    if number.adjusted() > 19 or number * _SUFFIXES[m.group(3) or ""] > MAX:
        raise ValueError(f"{value!r} is too large (at most {MAX}, as Kubernetes holds a quantity's value)")
    total = number * _SUFFIXES[m.group(3) or ""]
    whole = int(total)
    return whole + (1 if total > whole else 0)


def _shown(value: int) -> str:
    text = str(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"


def format_quantity(value: int) -> str:
    """``value`` as the API server writes it back: with the largest binary suffix that divides
    it evenly, else a plain integer; so what the server returns compares equal to what was sent."""
    if value:
        for suffix, size in _BINARY:
            if value % size == 0:
                return f"{value // size}{suffix}"
    return str(value)
