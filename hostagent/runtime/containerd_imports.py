"""What containerd reads: its root config, the files imported from it, in containerd's
order, and the CRI plugin section they leave it with (pure; files come through a reader).

containerd loads the root file, then the imported files breadth first: each file's
``imports`` (relative paths from the importing file's folder; an entry containing ``*`` is
a glob, its matches sorted) go to the end of the queue, a file already loaded is skipped,
and a missing file stops containerd. Each file is merged over the ones before it; for a
plugin's section, containerd before 2.1 keeps only the last file's (the whole section is
replaced, containerd#5837), 2.1 and later merge the sections table by table.

hostagent's drop-in therefore holds the CRI section as containerd would see it up to the
drop-in, plus hostagent's edits, and no file read after it may carry that section.
"""

from __future__ import annotations

import copy
import fnmatch
import posixpath

from ..errors import ConfigError
from . import tomledit as t

__all__ = ["load_order", "imports_of", "covers", "cri_section", "effective_section", "first_with_section"]


def imports_of(doc, where: str) -> list[str]:
    imports = t.unwrap(doc.get("imports", []))
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise ConfigError("imports is not a list of paths", where=where)
    return imports


def _absolute(entry: str, parent: str) -> str:
    path = posixpath.normpath(entry)
    return path if posixpath.isabs(path) else posixpath.join(posixpath.dirname(parent), path)


def _glob_match(pattern: str, path: str) -> bool:
    """Go's filepath.Match: ``*`` never crosses a ``/``."""
    parts, names = pattern.split("/"), path.split("/")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names))


def covers(entry: str, parent: str, path: str) -> bool:
    """Whether the import ``entry`` of the file ``parent`` names ``path``."""
    entry = _absolute(entry, parent)
    return _glob_match(entry, path) if "*" in entry else entry == path


def _resolve(entries: list[str], parent: str, reader, drop_in: str | None) -> list[str]:
    out = []
    for entry in entries:
        path = _absolute(entry, parent)
        if "*" not in path:
            out.append(path)
            continue
        matches = set(reader.glob(path))
        if drop_in and _glob_match(path, drop_in):
            matches.add(drop_in)              # matched once written
        out += sorted(matches)
    return out


def load_order(reader, config: str, root, root_imports: list[str], drop_in: str | None) -> list[tuple]:
    """(path, document) of every file containerd loads, in its order. ``root`` is the root
    file's document, ``root_imports`` its imports as they will be written; the drop-in is
    listed with None (it is not read: the plan writes it)."""
    order, seen = [], set()
    pending = [(p, config) for p in _resolve(root_imports, config, reader, drop_in)]
    order.append((config, root))
    seen.add(config)
    while pending:
        path, importer = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        if path == drop_in:
            order.append((path, None))
            continue
        text = reader.text(path)
        if text is None:
            raise ConfigError(f"imports {path}, which does not exist", where=importer,
                              hint="containerd cannot start with this; fix the imports first, nothing was changed")
        doc = t.parse(text, path)
        order.append((path, doc))
        pending += [(p, path) for p in _resolve(imports_of(doc, path), path, reader, drop_in)]
    return order


def cri_section(doc, key: str, where: str):
    """The file's CRI plugin section (a table), or None."""
    return t.get_table(doc, ["plugins", key], where)


def effective_section(loaded: list[tuple], key: str, *, merge: bool):
    """The CRI section containerd has after ``loaded``: the last one (``merge=False``,
    containerd before 2.1), or all merged table by table (2.1 and later). Returns (section,
    the files it comes from); (None, []) when no file has one (containerd's defaults)."""
    sections = [(path, cri_section(doc, key, path)) for path, doc in loaded if doc is not None]
    sections = [(path, s) for path, s in sections if s is not None]
    if not sections:
        return None, []
    if not merge or len(sections) == 1:
        return sections[-1][1], [sections[-1][0]]
    merged = copy.deepcopy(sections[0][1])
    for _, section in sections[1:]:
        _merge(merged, section)
    return merged, [path for path, _ in sections]


def _merge(into, section) -> None:
    for key, value in section.items():
        if key in into and t.is_table(into[key]) and t.is_table(value):
            _merge(into[key], value)
        elif t.is_table(value):
            t.remove_key(into, key)
            into[key] = copy.deepcopy(value)
        else:
            t.set_value(into, key, t.unwrap(value), t.key_indent(section, key))


def first_with_section(loaded: list[tuple], key: str) -> str | None:
    """The first of ``loaded`` that carries the CRI section, if any."""
    return next((path for path, doc in loaded if doc is not None and cri_section(doc, key, path) is not None), None)
