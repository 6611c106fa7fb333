"""Spec text: JSON, or YAML with every string double-quoted (YAML 1.1 readers would turn
unquoted ``yes``, ``1e3`` or ``0o17`` into booleans and numbers)."""

from __future__ import annotations

import json

__all__ = ["render"]


def _json(spec: dict) -> str:
    """JSON with one device, node, mount or hook per line: diffable, and fast (each line
    goes through the C encoder; a fully indented dump of a large spec is ten times slower)."""
    def items(values, indent):
        return ("[\n" + ",\n".join(indent + "  " + json.dumps(v) for v in values)
                + "\n" + indent + "]") if values else "[]"

    def edits(e, indent):
        lines = [f'{indent}  {json.dumps(k)}: {items(v, indent + "  ") if isinstance(v, list) else json.dumps(v)}'
                 for k, v in e.items()]
        return "{\n" + ",\n".join(lines) + "\n" + indent + "}"

    lines = []
    for key, value in spec.items():
        if key == "devices":
            text = items(value, "  ")
        elif key == "containerEdits":
            text = edits(value, "  ")
        else:
            text = json.dumps(value)
        lines.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def render(spec: dict, fmt: str = "json") -> str:
    if fmt == "json":
        return _json(spec)
    import yaml

    class QuotedDumper(yaml.SafeDumper):
        def ignore_aliases(self, data):   # no anchors: every device spelled out
            return True

    QuotedDumper.add_representer(
        str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"'))
    return yaml.dump(spec, Dumper=QuotedDumper, sort_keys=False, width=1 << 16)
