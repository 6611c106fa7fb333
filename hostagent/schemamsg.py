"""JSON Schema validation errors in plain words, for configuration files and API bodies
alike: ``unknown key 'devic' (did you mean 'device'?)`` rather than jsonschema's
``Additional properties are not allowed ('devic' was unexpected)``."""

from __future__ import annotations

from .suggest import did_you_mean, unknown
from .textdoc import shown

__all__ = ["describe", "chosen"]


def _extra_keys(error) -> list[str]:
    """The keys ``additionalProperties: false`` refused, in the document's order."""
    import re
    known = error.schema.get("properties", {})
    patterns = [re.compile(p) for p in error.schema.get("patternProperties", {})]
    return [k for k in error.instance if k not in known and not any(p.search(k) for p in patterns)]


def chosen(error):
    """The error to show for ``error``: where the value had to match one of several forms
    (``oneOf``, ``anyOf``) and exactly one form took its own keys, failing only deeper (an
    item ``{"device": ..., "sharing": {...}}`` whose limit is too long), that form's error:
    the one the value was meant as, at its own place (``absolute_path``). Otherwise
    ``error`` itself."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        forms: dict = {}
        for c in error.context:
            forms.setdefault(c.relative_schema_path[0], []).append(c)
        meant = [errors for errors in forms.values() if all(c.relative_path for c in errors)]
        if len(meant) == 1:
            import jsonschema
            return chosen(jsonschema.exceptions.best_match(meant[0]))
    return error


def describe(error) -> str:
    """One ``jsonschema.ValidationError``'s message, without its place (callers say where)."""
    kind = error.validator
    if kind == "additionalProperties" and isinstance(error.instance, dict) and error.schema.get(
            "additionalProperties") is False:
        known = error.schema.get("properties", {})
        extra = _extra_keys(error)
        if extra:
            return "; ".join(unknown("key", k, known) for k in extra)
    if kind in ("oneOf", "anyOf") and error.context:
        # The alternatives' own complaints about this object: an unknown key with a close
        # match in one alternative is almost surely a typo of that one's key.
        own = [describe(c) for c in error.context if not c.relative_path]
        keys = [d for d in own if d.startswith("unknown key")]
        hinted = [d for d in keys if "did you mean" in d]
        if hinted or keys:
            return (hinted or keys)[0]
        return "matches none of the forms allowed here: " + "; ".join(dict.fromkeys(own))
    if kind == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        return f"must be of type {wanted}, not {_json_type(error.instance)}"
    if kind == "required":
        return f"missing the required key {_missing(error)!r}"
    if kind == "enum" and isinstance(error.instance, str):
        choices = error.validator_value
        return (f"{shown(error.instance)} is not one of {', '.join(map(repr, choices))}"
                f"{did_you_mean(error.instance, [c for c in choices if isinstance(c, str)])}")
    # jsonschema's own words quote the whole value: quote it cut instead.
    return error.message.replace(repr(error.instance), shown(error.instance))


def _missing(error) -> str:
    import re
    found = re.match(r"'(.*)' is a required property", error.message)
    return found.group(1) if found else error.message


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "an object", list: "an array", str: "a string", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
