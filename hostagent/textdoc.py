"""Decoding the YAML and JSON documents users hand hostagent, safely.

JSON is read as JSON: Go's encoder indents with tabs, which YAML forbids, and mig-parted's
own files and tests are written that way. Anything else is YAML. Before either parser
runs, the document's bracket nesting is measured (a linear scan): PyYAML's scanner is
quadratic in flow nesting and both parsers recurse, so a few kilobytes of ``[`` would
otherwise cost minutes or end in a RecursionError.
"""

from __future__ import annotations

import re

from .errors import ConfigError

__all__ = ["decode", "too_deep", "MAX_NESTING"]

MAX_NESTING = 64          # real configuration files nest a handful of levels
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def too_deep(text: str) -> bool:
    """Whether ``text`` nests brackets more than MAX_NESTING deep (quotes are not parsed:
    a bound, not a parser)."""
    depth = 0
    for ch in _NOT_BRACKET.sub("", text):
        if ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return True
        else:
            depth -= 1
    return False


def decode(text: str | bytes, source: str, what: str, yaml_loader=None):
    """The document in ``text`` (``yaml_loader(text)`` for YAML; default yaml.safe_load);
    ConfigError naming ``source`` for anything that is not one, in one line."""
    import json

    import yaml
    raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    if too_deep(raw):
        raise ConfigError(f"nested more than {MAX_NESTING} levels deep; not a {what}", where=source)
    try:
        from .docerrors import syntax_error      # file:line:column, never the parser's own text
        if raw.lstrip().startswith(("{", "[")):
            try:
                return json.loads(raw)
            except json.JSONDecodeError as e:
                raise syntax_error(e, source, "JSON") from None
        try:
            return (yaml_loader or yaml.safe_load)(raw)
        except yaml.YAMLError as e:
            raise syntax_error(e, source, "YAML or JSON") from None
    except RecursionError:            # block-style nesting, which has no brackets to count
        raise ConfigError(f"nested too deeply to be a {what}", where=source) from None
