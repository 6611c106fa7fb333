"""Comment- and layout-preserving edits of TOML files (containerd, CRI-O), over tomlkit.

tomlkit keeps comments and formatting but leaves indentation of new items to the caller;
the helpers here make an added key or table look like its neighbours.
"""

from __future__ import annotations

import copy

from ..errors import ConfigError

__all__ = ["parse", "dumps", "get_table", "ensure_table", "set_value", "remove_key", "copy_table", "unwrap",
           "indent_new", "original_key", "value_indent", "is_table", "dotted", "key_indent"]


def parse(text: str, where: str):
    import tomlkit
    from tomlkit.exceptions import ParseError
    try:
        return tomlkit.parse(text)
    except ParseError as e:
        import re
        message = re.sub(r" at line \d+ col \d+$", "", str(e))
        end = "'\\x00'" in message                 # tomlkit's end of file, at no useful place
        message = "unexpected end of file" if end else message
        raise ConfigError(f"not valid TOML: {message}", where=where if end else f"{where}:{e.line}:{e.col + 1}",
                          hint="fix the file by hand; nothing was changed") from None


def dumps(doc) -> str:
    import tomlkit
    return tomlkit.dumps(doc)


def unwrap(item):
    return item.unwrap() if hasattr(item, "unwrap") else item


def is_table(item) -> bool:
    from tomlkit.items import Table
    from tomlkit.container import Container
    return isinstance(item, (Table, Container))



def dotted(keys) -> str:
    """A key path as TOML writes it: ``plugins."io.containerd.grpc.v1.cri".containerd``."""
    return ".".join(k if k.replace("_", "").replace("-", "").isalnum() else f'"{k}"' for k in keys)


def get_table(container, keys, where: str | None = None, prefix=()):
    """The table at ``keys`` (a list of key names), or None if any part is missing. With
    ``where``, a part that exists but is not a table is an error rather than missing (named
    with ``prefix``, the keys leading to ``container``)."""
    for i, key in enumerate(keys):
        if container is None or key not in container:
            return None
        if not is_table(container[key]):
            if where:
                raise ConfigError(f"{dotted([*prefix, *keys[:i + 1]])} is a {type(unwrap(container[key])).__name__}, "
                                  "not a table", where=where)
            return None
        container = container[key]
    return container


def ensure_table(container, keys, where: str = "config", prefix=()):
    """The table at ``keys``, creating missing ones as super tables (no empty headers; a
    super table becomes a plain one when a key is set in it). A part that is not a table
    is an error, named as in ``get_table``."""
    import tomlkit
    for i, key in enumerate(keys):
        if key not in container:
            container[key] = tomlkit.table(is_super_table=True)
        elif not is_table(container[key]):
            raise ConfigError(f"{dotted([*prefix, *keys[:i + 1]])} is a {type(unwrap(container[key])).__name__}, "
                              "not a table", where=where)
        container = container[key]
    return container


def _body(table):
    value = getattr(table, "value", table)       # Table -> Container; a Container is itself
    return [(k.key, v) for k, v in value.body if k is not None]


def key_indent(table, key: str) -> str | None:
    """The indentation of ``table``'s plain value ``key``."""
    return next((v.trivia.indent for k, v in _body(table) if k == key and hasattr(v, "trivia")), None)


def value_indent(table) -> str | None:
    for _, v in _body(table):
        if not is_table(v) and hasattr(v, "trivia"):
            return v.trivia.indent
    return None


def set_value(table, key: str, value, indent: str | None = None) -> None:
    """Set ``key``; a new key gets ``indent``, else the indentation of the table's other keys."""
    import tomlkit
    from tomlkit.items import Table
    if key in table:
        old = table[key]
        if unwrap(old) == value:
            return
        item = tomlkit.item(value)
        if hasattr(old, "trivia"):
            item.trivia.indent = old.trivia.indent
            item.trivia.comment_ws, item.trivia.comment = old.trivia.comment_ws, old.trivia.comment
        table[key] = item
        return
    indent = value_indent(table) if indent is None else indent
    if indent is None and isinstance(table, Table) and not table.is_super_table():
        indent = table.trivia.indent + "  " if table.trivia.indent else ""
    table[key] = value
    if indent is not None:
        (table.value if isinstance(table, Table) else table).item(key).trivia.indent = indent


def indent_new(table, base: str, step: str = "  ") -> None:
    """Lay out a table built from scratch: header at ``base``, its keys one ``step`` in."""
    table.trivia.indent = base
    for _, v in _body(table):
        if is_table(v):
            indent_new(v, base + step, step)
        elif hasattr(v, "trivia"):
            v.trivia.indent = base + step


def original_key(container, name: str):
    """The Key object of ``name`` in ``container`` (keeps its quoting style), else ``name``."""
    value = getattr(container, "value", container)
    return next((k for k, _ in value.body if k is not None and k.key == name), name)


def remove_key(table, key: str) -> None:
    if key in table:
        del table[key]


def _strip_comments(item) -> None:
    if hasattr(item, "trivia") and not is_table(item):
        item.trivia.comment = ""
        item.trivia.comment_ws = ""
    if is_table(item):
        from tomlkit.items import Comment
        body = item.value.body
        body[:] = [(k, v) for k, v in body if not isinstance(v, Comment)]
        for _, v in _body(item):
            _strip_comments(v)


def _mirror(new, old) -> None:
    """Give ``new`` (a copy of ``old``) the indentation ``old`` has."""
    new.trivia.indent = old.trivia.indent
    olds = dict(_body(old))
    for key, v in _body(new):
        if key in olds and hasattr(v, "trivia"):
            if is_table(v):
                _mirror(v, olds[key])
            else:
                v.trivia.indent = olds[key].trivia.indent


def _ends_with_blank_line(item) -> bool:
    from tomlkit.items import Whitespace
    body = item.value.body if is_table(item) else []
    if not body:
        return False
    last = body[-1][1]
    if isinstance(last, Whitespace):
        return "\n" in last.s
    return _ends_with_blank_line(last) if is_table(last) else False


def copy_table(parent, key: str, source) -> object:
    """Put a copy of table ``source`` at ``parent[key]``, laid out like ``source``, its
    comments dropped (they describe the source)."""
    new = copy.deepcopy(source)
    _strip_comments(new)
    previous = _body(parent)[-1][1] if _body(parent) else None
    parent[key] = new
    new = parent[key]
    _mirror(new, source)
    if previous is not None and is_table(previous) and not _ends_with_blank_line(previous):
        new.trivia.indent = "\n" + new.trivia.indent
    return new
