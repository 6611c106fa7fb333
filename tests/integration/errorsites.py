"""Every error message hostagent's code can raise, found in the code itself: each ``raise``
of an error class (``HostagentError`` and its subclasses, the hook's ``HookError``, the DRA
plugin's ``ClaimError``) given its message as a literal or an f-string. A message is its
constant parts, in order; what the f-string fills in may be anything. A new raise site is
found the day it is written."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

import hostagent
from hostagent.errors import HostagentError
from hostagent.hooks.errors import HookError
from hostagent.plugins.dra.claims import ClaimError

__all__ = ["ErrorSite", "error_classes", "error_sites", "rows_for", "page_lines"]

PACKAGE = Path(hostagent.__file__).resolve().parent
BASES = (HostagentError, HookError, ClaimError)
# A message whose constant parts are all shorter says too little to be found in a page.
MIN_TEXT = 8


@dataclass(frozen=True)
class ErrorSite:
    where: str                   # path:line
    error: str                   # the class raised
    parts: tuple[str, ...]       # the message's constant parts, in order

    @property
    def template(self) -> str:
        return " ... ".join(self.parts)

    def pattern(self) -> re.Pattern:
        return re.compile(".*?".join(re.escape(p) for p in self.parts))


def error_classes() -> set[str]:
    """The names of the error classes hostagent's modules define or import."""
    names = set()
    for info in pkgutil.walk_packages(hostagent.__path__, "hostagent."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        names.update(n for n, o in vars(module).items() if inspect.isclass(o) and issubclass(o, BASES))
    return names


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _parts(node: ast.expr) -> tuple[str, ...] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        pieces = [node.value]
    elif isinstance(node, ast.JoinedStr):
        pieces, current = [], ""
        for value in node.values:
            if isinstance(value, ast.Constant):
                current += value.value
            else:
                pieces.append(current)
                current = ""
        pieces.append(current)
    else:
        return None                  # a message made elsewhere: its own raise site is found
    return tuple(p for p in (_normal(p).strip() for p in pieces) if p)


def error_sites() -> list[ErrorSite]:
    classes = error_classes()
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            parts = _parts(node.exc.args[0]) if name in classes else None
            if parts and max(map(len, parts)) >= MIN_TEXT:
                out.append(ErrorSite(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", name, parts))
    return out


def rows_for(site: ErrorSite, lines: list[str]) -> list[str]:
    """The page's lines (table rows) that say ``site``'s message: its constant parts in
    order on one line."""
    pattern = site.pattern()
    return [line for line in lines if pattern.search(line)]


def page_lines(text: str) -> list[str]:
    """A Markdown page's lines as their text reads: ``\\|`` in a table cell is ``|``."""
    return [_normal(line.replace("\\|", "|")) for line in text.splitlines()]
