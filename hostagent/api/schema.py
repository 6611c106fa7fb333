"""The OpenAPI document is the one source of truth for request bodies: each operation's
body is validated against the schema the document gives it, references resolved inside the
document.

A body is first checked by the same schema compiled to Python (fastjsonschema, draft 7),
where every keyword the schema uses means the same in draft 7 as in the document's 2020-12
(checked when it is compiled; otherwise there is no compiled check). A body it accepts is
valid; one it refuses goes to jsonschema, which decides (the compiled check is stricter
where draft 7 differs in detail: 1.0 is no integer there) and words the errors. jsonschema,
with its 9 MB, is loaded only for a body the compiled check refused.
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


def _number(text: str):
    """A JSON number with a fraction or exponent: an integer when it has no fraction
    (``2.0`` is 2), as configuration files read it (``textdoc``)."""
    value = float(text)
    return int(value) if value.is_integer() else value


def parse_json(body: bytes):
    """Strict JSON: UTF-8, no NaN or Infinity; a number without a fraction is an integer."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant, parse_float=_number)
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
def _schema(operation_id: str) -> dict:
    """The operation's body schema, component references inlined."""
    doc = document()
    for item in doc["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and op.get("operationId") == operation_id:
                return _inline(op["requestBody"]["content"]["application/json"]["schema"],
                               doc["components"]["schemas"])
    raise KeyError(operation_id)


@functools.cache
def _validator(operation_id: str):
    from ..schemas import Draft202012
    doc = document()
    # A root holding the components, so references left (recursive ones) resolve.
    root = {"$schema": doc["jsonSchemaDialect"], "components": doc["components"], **_schema(operation_id)}
    return Draft202012(root, format_checker=None)


# Keywords that mean the same in draft 7 as in 2020-12: by their kind of value.
_SCHEMA_MAPS = {"properties", "patternProperties"}
_SCHEMAS = {"items", "additionalProperties", "propertyNames", "not"}
_SCHEMA_LISTS = {"anyOf", "oneOf", "allOf"}
_VALUES = {"type", "required", "pattern", "minLength", "maxLength", "minimum", "maximum", "minItems",
           "maxItems", "minProperties", "maxProperties", "description", "title", "default", "examples"}


def _same_in_draft7(node) -> bool:
    """Whether ``node`` uses only keywords that mean the same in draft 7, with no
    reference left, and ``enum``/``const`` only of strings (draft 7 code compares with
    ``==``, and True == 1)."""
    if isinstance(node, bool):
        return True
    if not isinstance(node, dict):
        return False
    for key, value in node.items():
        if key in _SCHEMA_MAPS:
            if not all(_same_in_draft7(v) for v in value.values()):
                return False
        elif key in _SCHEMAS:
            if not _same_in_draft7(value):
                return False
        elif key in _SCHEMA_LISTS:
            if not all(_same_in_draft7(v) for v in value):
                return False
        elif key in ("enum", "const"):
            if not all(isinstance(v, str) for v in (value if key == "enum" else [value])):
                return False
        elif key not in _VALUES:
            return False
    return True


@functools.cache
def _compiled(operation_id: str):
    """The compiled check of the operation's body, or None where it could differ."""
    schema = _schema(operation_id)
    if not _same_in_draft7(schema):
        return None
    import fastjsonschema
    return fastjsonschema.compile({**schema, "$schema": "http://json-schema.org/draft-07/schema#"},
                                  use_default=False, use_formats=False, detailed_exceptions=False)


def _where(path) -> str:
    out = "body"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def validate_body(operation_id: str, data) -> None:
    """Raise UsageError naming every problem (up to ten) with its place in the body."""
    compiled = _compiled(operation_id)
    if compiled is not None:
        from fastjsonschema import JsonSchemaException
        try:
            compiled(data)
            return
        except JsonSchemaException:
            pass                                     # jsonschema decides, and says why
    validator = _validator(operation_id)
    errors = list(validator.iter_errors(data))
    if not errors:
        return
    import jsonschema
    from ..schemamsg import chosen, describe
    errors = [chosen(e) for e in errors]
    errors.sort(key=jsonschema.exceptions.relevance)
    best = jsonschema.exceptions.best_match(errors)
    problems = [{"path": _where(e.absolute_path), "message": describe(e)[:300]}
                for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))[:_MAX_ERRORS]]
    raise UsageError(f"{_where(best.absolute_path)}: {describe(best)[:300]}", problems=problems)
