"""JSON Schema validators whose ``pattern`` means what the schema says.

JSON Schema patterns are ECMA-262 regular expressions, where ``$`` is the end of the string.
The ``jsonschema`` library runs them with Python's ``re``, where ``$`` also matches before a
final newline, so ``^[0-9]+$`` would let ``"42\\n"`` through. Here an unescaped ``$`` outside
a character class is ``\\Z``: the end, and only the end. Every schema the agent checks
input against goes through these (``Draft7``, ``Draft202012``).
"""

from __future__ import annotations

import functools
import re

import jsonschema
from jsonschema import ValidationError, validators

__all__ = ["Draft7", "Draft202012", "strict_pattern"]


@functools.lru_cache(maxsize=256)
def strict_pattern(pattern: str) -> re.Pattern:
    """``pattern`` compiled with ``$`` (unescaped, outside ``[...]``) as ``\\Z``."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":        # "[]...]": a literal ] first
                out.append("[]")
                i += 2
                continue
        elif c == "$":
            c = r"\Z"
        out.append(c)
        i += 1
    return re.compile("".join(out))


def _pattern(validator, patrn, instance, schema):
    if validator.is_type(instance, "string") and not strict_pattern(patrn).search(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


Draft7 = validators.extend(jsonschema.Draft7Validator, {"pattern": _pattern})
Draft202012 = validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})
