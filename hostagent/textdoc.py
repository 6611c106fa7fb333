"""The one reader of the YAML and JSON documents users hand hostagent: its configuration,
the device plugin's sharing file, mig-parted's config and hooks files, CDI specs in YAML.

The device plugin and mig-parted read these files with sigs.k8s.io/yaml over go-yaml v2,
and a document means here what it means to them:

- JSON is YAML: a file that starts with ``{`` is read like any other, so what go-yaml
  takes is taken (a trailing comma, ``[1, 2,]``), and so are tabs between tokens inside
  brackets or after a value, where go-yaml allows them and PyYAML alone does not (Go's
  JSON encoder indents with tabs);
- plain scalars are typed by go-yaml's YAML 1.1 rules (``yamlgo``);
- a number without a fraction is an integer (``2.0`` is 2): sigs.k8s.io/yaml passes the
  document through JSON, where the two are one, and where NaN and infinities have no place;
- mapping keys are strings as written (go-yaml would turn a key ``off`` into "false": a
  mig-parted config named ``off`` keeps its name here).

Bounds come first: brackets nest at most MAX_NESTING deep (PyYAML's scanner is quadratic
in flow nesting, and the parsers recurse), and a document holds at most MAX_NODES values
with every alias expanded, so an alias bomb (anchors of aliases of anchors: a few hundred
bytes standing for gigabytes) is refused at once. ``shown`` cuts a value for a message.
"""

from __future__ import annotations

import functools
import math
import re

from .errors import ConfigError

__all__ = ["decode", "normalise", "shown", "cut", "too_deep", "MAX_NESTING", "MAX_NODES"]

MAX_NESTING = 64          # real configuration files nest a handful of levels
MAX_NODES = 100_000       # values, aliases expanded: real files have at most a few thousand
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_PLAIN = "!plain"         # the loader's tag for an untagged plain scalar: typed here, as go-yaml does
_TAG = "tag:yaml.org,2002:"


class _TooLarge(Exception):
    pass


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


def cut(text: str, limit: int = 60) -> str:
    """``text`` as a message quotes it: at most ``limit`` characters (a value of a document
    may be megabytes)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown(value, limit: int = 60) -> str:
    """``value``'s repr, cut (reprlib never builds more of it than it shows)."""
    import reprlib
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, limit, limit, limit
    return cut(r.repr(value), limit)


@functools.cache
def _loader():
    import yaml

    class Loader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self.nodes = 0

        def scan_to_next_token(self):
            # libyaml's rule, which go-yaml ports: tabs separate tokens in the flow context
            # and where no key can start; PyYAML skips spaces only.
            if self.index == 0 and self.peek() == "\uFEFF":
                self.forward()
            while True:
                while self.peek() == " " or (self.peek() == "\t" and (self.flow_level or not self.allow_simple_key)):
                    self.forward()
                if self.peek() == "#":
                    while self.peek() not in "\0\r\n\x85\u2028\u2029":
                        self.forward()
                if not self.scan_line_break():
                    return
                if not self.flow_level:
                    self.allow_simple_key = True

        def compose_node(self, parent, index):
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise _TooLarge
            return super().compose_node(parent, index)

        def resolve(self, kind, value, implicit):
            if kind is yaml.ScalarNode and implicit[0]:
                return _PLAIN
            return super().resolve(kind, value, implicit)

    return Loader


class _Builder:
    """Python values from PyYAML's node graph, typed as go-yaml types them, aliases
    expanded (each use a value of its own, as in Go) within the node budget."""

    def __init__(self, source: str, on_plain):
        import yaml
        self.yaml = yaml
        self.source = source
        self.on_plain = on_plain
        self.left = MAX_NODES

    def error(self, node, where: str, what: str) -> ConfigError:
        mark = node.start_mark
        return ConfigError(f"{where + ': ' if where else ''}{what}",
                           where=f"{self.source}:{mark.line + 1}:{mark.column + 1}",
                           line=mark.line + 1, column=mark.column + 1)

    def build(self, node, where: str = "", key: str | None = None):
        self.left -= 1
        if self.left < 0:
            raise _TooLarge
        if isinstance(node, self.yaml.MappingNode):
            return self.mapping(node, where)
        if isinstance(node, self.yaml.SequenceNode):
            if node.tag != _TAG + "seq":
                raise self.error(node, where, f"the YAML tag {node.tag} is not supported")
            return [self.build(item, f"{where}[{i}]", key) for i, item in enumerate(node.value)]
        return self.scalar(node, where, key)

    def scalar(self, node, where: str, key: str | None):
        from .yamlgo import go_scalar
        if node.tag == _TAG + "str":
            return node.value
        if node.tag == _PLAIN:
            kind, value = go_scalar(node.value)
            if self.on_plain is not None:
                self.on_plain(where, key, node.value, kind)
        elif node.tag in (_TAG + "int", _TAG + "float", _TAG + "bool", _TAG + "null"):
            kind, value = go_scalar(node.value)
            wanted = node.tag[len(_TAG):]
            if kind != wanted and (wanted, kind) != ("float", "int"):
                raise self.error(node, where, f"{shown(node.value)} is not a YAML {wanted}")
        else:
            raise self.error(node, where, f"the YAML tag {node.tag} is not supported")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self.error(node, where, f"{node.value} is not a number a JSON document can hold")
            if value.is_integer():
                return int(value)
        return value

    def mapping(self, node, where: str) -> dict:
        if node.tag != _TAG + "map":
            raise self.error(node, where, f"the YAML tag {node.tag} is not supported")
        merged: dict = {}
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, self.yaml.ScalarNode):
                raise self.error(key_node, where, "a mapping key must be a single value, not a list or mapping")
            if key_node.tag == _PLAIN and key_node.value == "<<":
                for m in self.merges(value_node, where):      # the first mapping named wins
                    for k, v in m.items():
                        merged.setdefault(k, v)
                continue
            key = key_node.value
            out[key] = self.build(value_node, f"{where}.{key}" if where else key, key)
        merged.update(out)
        return merged

    def merges(self, node, where: str) -> list[dict]:
        """The mappings of a merge key (``<<: *base`` or ``<<: [*a, *b]``)."""
        nodes = node.value if isinstance(node, self.yaml.SequenceNode) else [node]
        if not all(isinstance(n, self.yaml.MappingNode) for n in nodes):
            raise self.error(node, where, "'<<' merges a mapping or a list of mappings")
        return [self.mapping(n, where) for n in nodes]


def normalise(value, budget: list[int] | None = None):
    """A JSON value as sigs.k8s.io/yaml leaves it: numbers without a fraction are integers.
    At most MAX_NODES values (ConfigError beyond, without a place: callers say where)."""
    budget = budget if budget is not None else [MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise ConfigError(f"has more than {MAX_NODES} values")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: normalise(v, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, budget) for v in value]
    return value


def decode(text: str | bytes, source: str, what: str, *, on_plain=None, syntax: str = "YAML or JSON"):
    """The document in ``text``; ConfigError naming ``source`` for anything that is not one,
    in one line (``syntax``: what a syntax error says it is not). ``on_plain(where, key,
    text, kind)`` sees every untagged plain scalar, with its place, its mapping key and
    go-yaml's type (``yamlgo.go_scalar``)."""
    import yaml
    from .docerrors import syntax_error      # file:line:column, never the parser's own text
    raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    if too_deep(raw):
        raise ConfigError(f"nested more than {MAX_NESTING} levels deep; not a {what}", where=source)
    try:
        node = yaml.compose(raw, Loader=_loader())
        return None if node is None else _Builder(source, on_plain).build(node)
    except yaml.YAMLError as e:
        if raw.lstrip().startswith(("{", "[")):
            return _as_json(raw, source, what, e, syntax)
        raise syntax_error(e, source, syntax) from None
    except _TooLarge:
        raise _too_large(source, what) from None
    except RecursionError:            # block-style nesting, which has no brackets to count
        raise ConfigError(f"nested too deeply to be a {what}", where=source) from None


def _as_json(raw: str, source: str, what: str, yaml_error, syntax: str):
    """A document that looks like JSON and that PyYAML refused: JSON's own reason (a JSON
    writer knows its words), or the document where only PyYAML objects (a control
    character in a string, which JSON and go-yaml allow)."""
    import json
    from .docerrors import syntax_error
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise syntax_error(e, source, "JSON") from None
    except (ValueError, RecursionError):
        raise syntax_error(yaml_error, source, syntax) from None
    try:
        return normalise(doc)
    except ConfigError:
        raise _too_large(source, what) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _too_large(source: str, what: str) -> ConfigError:
    return ConfigError(f"has more than {MAX_NODES} values (aliases expanded), more than any {what} needs; "
                       "not read", where=source)
