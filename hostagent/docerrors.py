"""A YAML or JSON syntax error as one line that names the file, line and column, as
compilers do: ``/etc/hostagent/config.yaml:3:9: not valid YAML: mapping values are not
allowed here``. Never the parser's own text, which names ``<byte string>`` or
``<unicode string>`` instead of the file and spreads over several lines."""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["syntax_error", "position"]


def position(error) -> tuple[int, int] | None:
    """(line, column), both from 1, of a PyYAML or json error; None if it has none."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if mark is not None:
        return mark.line + 1, mark.column + 1
    if getattr(error, "lineno", None) is not None:
        return error.lineno, error.colno
    return None


def _problem(error) -> str:
    if hasattr(error, "problem_mark") or hasattr(error, "context_mark"):     # MarkedYAMLError
        text = error.problem or error.context or "syntax error"
        mark = error.context_mark
        if error.problem and error.context and mark is not None:
            text += f" ({error.context} at line {mark.line + 1}, column {mark.column + 1})"
        return text
    return getattr(error, "msg", None) or str(error).splitlines()[0]


def syntax_error(error, source: str, kind: str = "YAML", *, hint: str | None = None) -> ConfigError:
    """The ConfigError for ``error``, raised parsing ``source`` as ``kind``."""
    at = position(error)
    where = f"{source}:{at[0]}:{at[1]}" if at else source
    return ConfigError(f"not valid {kind}: {_problem(error)}", where=where, hint=hint,
                       **({"line": at[0], "column": at[1]} if at else {}))
