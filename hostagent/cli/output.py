"""Rendering of command results: tables for people, JSON or YAML for programs."""

from __future__ import annotations

import sys

__all__ = ["FORMATS", "add_output_flag", "emit", "table", "to_plain"]

FORMATS = ("table", "json", "yaml")


def add_output_flag(parser) -> None:
    parser.add_argument("-o", "--output", choices=FORMATS, default="table",
                        help="output format (default: table)")


def to_plain(obj):
    """Records to plain dicts/lists that JSON and YAML can hold."""
    import dataclasses   # here, not at import: every command's start-up pays for module imports
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def emit(data, fmt: str, render_table) -> None:
    """Print ``data`` as JSON/YAML, or call ``render_table(data)`` for the table format."""
    if fmt == "json":
        import json
        json.dump(to_plain(data), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif fmt == "yaml":
        import yaml
        yaml.safe_dump(to_plain(data), sys.stdout, sort_keys=False)
    else:
        render_table(data)


def table(headers: list[str], rows: list[list], *, indent: str = "") -> str:
    cells = [[str(c) for c in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(indent + line for line in lines)
