"""JSON decoding without importing :mod:`json`.

``import json`` compiles regular expressions and loads the encoder, about 10 ms on a cold
interpreter; the hook decodes two small documents per container start. CPython's C scanner
(``_json.make_scanner``) does the whole parse by itself when given a plain context, so the
hook uses it directly and falls back to :mod:`json` where ``_json`` is missing.
"""

_WS = " \t\n\r"


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


class _Context:
    # The attributes the C scanner reads; strict JSON, no hooks.
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constants)
    memo: dict = {}


def loads(data: bytes):
    """Decode one JSON document; ValueError (with a short reason) on anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    try:
        return _fast(text)
    except Exception:
        # Only broken input gets here. The C scanner reports its errors through
        # json.decoder (a SystemError when that module is not loaded), so let the full
        # module parse again: it either gives the precise message or the value.
        pass
    import json
    try:
        return json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    # A json.JSONDecodeError (a ValueError) goes on as it is: it knows the line and column.


def _fast(text: str):
    import _json                                     # ImportError: not CPython, use json
    n = len(text)
    start = 0
    while start < n and text[start] in _WS:
        start += 1
    value, end = _json.make_scanner(_Context())(text, start)
    while end < n and text[end] in _WS:
        end += 1
    if end != n:
        raise ValueError("extra data")
    return value
