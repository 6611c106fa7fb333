"""The OpenAPI document is the one source of truth for request bodies: each operation's
body is validated against the schema the document gives it, references resolved inside the
document.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ..errors import UsageError

__all__ = ["document", "document_bytes", "parse_json", "validate_body", "InvalidJson"]

_PATH = Path(__file__).with_name("openapi.json")
_MAX_ERRORS = 10


class InvalidJson(UsageError):
    code = "invalid_json"


@functools.cache
def document_bytes() -> bytes:
    return _PATH.read_bytes()


@functools.cache
def document() -> dict:
    return json.loads(document_bytes())


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_json(body: bytes):
    """Strict JSON: UTF-8, no NaN or Infinity."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise InvalidJson(f"the body is not UTF-8: {e.reason} at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise InvalidJson(f"the body is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}",
                          line=e.lineno, column=e.colno) from None
    except (ValueError, RecursionError) as e:
        raise InvalidJson(f"the body is not valid JSON: {e}") from None


_COMPONENT = "#/components/schemas/"


def _inline(node, components: dict, within: tuple = ()):
    """``node`` with its references to component schemas replaced by the schemas, except
    where one refers to itself (kept as a reference): resolving a reference at every
    validation was most of a request's validation time."""
    if isinstance(node, list):
        return [_inline(v, components, within) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if len(node) == 1 and isinstance(ref, str) and ref.startswith(_COMPONENT):
        name = ref[len(_COMPONENT):]
        if name not in within and name in components:
            return _inline(components[name], components, (*within, name))
        return node
    return {k: _inline(v, components, within) for k, v in node.items()}


@functools.cache
def _validator(operation_id: str):
    from ..schemas import Draft202012
    doc = document()
    for item in doc["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and op.get("operationId") == operation_id:
                schema = _inline(op["requestBody"]["content"]["application/json"]["schema"],
                                 doc["components"]["schemas"])
                # A root holding the components, so references left (recursive ones) resolve.
                root = {"$schema": doc["jsonSchemaDialect"], "components": doc["components"], **schema}
                return Draft202012(root, format_checker=None)
    raise KeyError(operation_id)


def _where(path) -> str:
    out = "body"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def validate_body(operation_id: str, data) -> None:
    """Raise UsageError naming every problem (up to ten) with its place in the body."""
    validator = _validator(operation_id)
    errors = list(validator.iter_errors(data))
    if not errors:
        return
    import jsonschema
    from ..schemamsg import describe
    errors.sort(key=jsonschema.exceptions.relevance)
    best = jsonschema.exceptions.best_match(errors)
    problems = [{"path": _where(e.absolute_path), "message": describe(e)[:300]}
                for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))[:_MAX_ERRORS]]
    raise UsageError(f"{_where(best.absolute_path)}: {describe(best)[:300]}", problems=problems)
