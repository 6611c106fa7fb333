"""YAML specs as the CDI library reads them: plain scalars typed by go-yaml v2's YAML 1.1
rules, and every plain scalar in a string field that those rules turn into something else.

PyYAML and go-yaml disagree on plain scalars: PyYAML keeps ``1e3`` and ``0o17`` strings
and reads ``1:30`` as 90, while go-yaml reads ``1e3`` as 1000.0, ``0o17`` as 15 and
``1:30`` as a string. The CDI library then decodes strictly into string fields, so an
unquoted ``name: 1e3`` or ``path: yes`` makes the whole file fail on the engine. This
module builds the document from PyYAML's node tree with go-yaml's typing instead.
"""

from __future__ import annotations

import re

__all__ = ["load_go_yaml", "go_scalar"]

_BOOLS = {**dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
          **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False)}
_NULLS = ("", "~", "null", "Null", "NULL")
_SPECIAL_FLOATS = {**dict.fromkeys((".nan", ".NaN", ".NAN"), float("nan")),
                   **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), float("inf")),
                   **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), float("-inf"))}
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")   # fullmatch: whole values
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?", re.DOTALL)
_INT_BODY = re.compile(r"0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*")

# Fields the CDI structs type as numbers or booleans; every other scalar is a string.
NUMBER_FIELDS = frozenset(("major", "minor", "fileMode", "uid", "gid", "timeout", "additionalGids"))
BOOL_FIELDS = frozenset(("enableMonitoring", "enableCMT", "enableMBM"))


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


def load_go_yaml(text: str) -> tuple[object, list[str]]:
    """(document, problems): the document as go-yaml types it, and one problem per plain
    scalar in a string field that it does not type as a string."""
    import yaml
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    problems: list[str] = []
    return _build(node, "", None, problems), problems


def _build(node, where: str, field: str | None, problems: list[str]):
    import yaml
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = key_node.value
            out[key] = _build(value_node, f"{where}.{key}" if where else key, key, problems)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, f"{where}[{i}]", field, problems) for i, item in enumerate(node.value)]
    if node is None:
        return None
    if node.style is not None:                   # quoted or block: always a string
        return node.value
    kind, value = go_scalar(node.value)
    # Numbers and booleans are checked by the validator; an empty value is a missing one.
    if field not in NUMBER_FIELDS and field not in BOOL_FIELDS and kind != "str" and node.value:
        problems.append(f"{where or 'document'}: unquoted {node.value!r} is read as a {kind} by YAML 1.1 "
                        "readers (the CDI library), not as a string; quote it")
    return value
