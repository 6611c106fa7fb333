"""Spec text: JSON, or YAML with every string double-quoted (YAML 1.1 readers would turn
unquoted ``yes``, ``1e3`` or ``0o17`` into booleans and numbers)."""

from __future__ import annotations

import json

__all__ = ["render"]


def render(spec: dict, fmt: str = "json") -> str:
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    import yaml

    class QuotedDumper(yaml.SafeDumper):
        def ignore_aliases(self, data):   # no anchors: every device spelled out
            return True

    QuotedDumper.add_representer(
        str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"'))
    return yaml.dump(spec, Dumper=QuotedDumper, sort_keys=False, width=1 << 16)
