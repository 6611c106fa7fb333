"""Plain YAML scalars typed as go-yaml v2 types them (YAML 1.1), the reader under
sigs.k8s.io/yaml, which the device plugin, mig-parted and the CDI library read files with.

PyYAML and go-yaml disagree on plain scalars: PyYAML keeps ``1e3`` and ``0o17`` strings
and reads ``1:30`` as 90 and ``2024-01-02`` as a date, while go-yaml reads ``1e3`` as
1000.0, ``0o17`` as 15, and keeps ``1:30`` and (decoding into untyped values) timestamps as
strings.
"""

from __future__ import annotations

import re

__all__ = ["go_scalar"]

_BOOLS = {**dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
          **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False)}
_NULLS = ("", "~", "null", "Null", "NULL")
_SPECIAL_FLOATS = {**dict.fromkeys((".nan", ".NaN", ".NAN"), float("nan")),
                   **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), float("inf")),
                   **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), float("-inf"))}
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")   # fullmatch: whole values
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?", re.DOTALL)
_INT_BODY = re.compile(r"0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*")


def go_scalar(text: str):
    """(type name, value) go-yaml v2 gives a plain scalar: str, bool, null, int, float or
    timestamp (a timestamp's value is left as the text)."""
    if text in _BOOLS:
        return "bool", _BOOLS[text]
    if text in _NULLS:
        return "null", None
    if text in _SPECIAL_FLOATS:
        return "float", _SPECIAL_FLOATS[text]
    if text[:1] in "+-0123456789":
        if _TIMESTAMP.fullmatch(text):
            return "timestamp", text
        plain = text.replace("_", "")
        sign, body = (plain[0], plain[1:]) if plain[:1] in "+-" else ("", plain)
        if _INT_BODY.fullmatch(body):
            base = 8 if len(body) > 1 and body[0] == "0" and body[1].isdigit() else 0
            return "int", int(sign + body, base)
        if _FLOAT.fullmatch(plain):
            return "float", float(plain)
    elif text[:1] == ".":
        try:
            return "float", float(text)
        except ValueError:
            pass
    return "str", text
