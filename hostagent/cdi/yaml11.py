"""YAML specs as the CDI library reads them: every plain scalar in a string field that
go-yaml v2's YAML 1.1 rules turn into something else is a problem.

The CDI library decodes strictly into string fields, so an unquoted ``name: 1e3`` or
``path: yes`` makes the whole file fail on the engine, where PyYAML alone would have read
a string. The document itself is read by the one reader (``textdoc``), which types plain
scalars as go-yaml does.
"""

from __future__ import annotations

__all__ = ["load_go_yaml", "NUMBER_FIELDS", "BOOL_FIELDS"]

# Fields the CDI structs type as numbers or booleans; every other scalar is a string.
NUMBER_FIELDS = frozenset(("major", "minor", "fileMode", "uid", "gid", "timeout", "additionalGids"))
BOOL_FIELDS = frozenset(("enableMonitoring", "enableCMT", "enableMBM"))


def load_go_yaml(text: str, source: str) -> tuple[object, list[str]]:
    """(document, problems): the document as go-yaml types it, and one problem per plain
    scalar in a string field that it does not type as a string."""
    from ..textdoc import decode
    problems: list[str] = []

    def plain(where: str, field: str | None, value: str, kind: str) -> None:
        # Numbers and booleans are checked by the validator; an empty value is a missing one.
        if field not in NUMBER_FIELDS and field not in BOOL_FIELDS and kind != "str" and value:
            problems.append(f"{where or 'document'}: unquoted {value!r} is read as a {kind} by YAML 1.1 "
                            "readers (the CDI library), not as a string; quote it")
    return decode(text, source, "CDI spec", on_plain=plain, syntax="YAML"), problems     # .json is JSON
