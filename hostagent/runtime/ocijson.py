"""config.json in and out of the runtime shim without importing :mod:`json`.

``import json`` compiles regular expressions (importing re, enum and functools): about a
quarter of the shim's Python part at a GPU container's create. CPython's C scanner and
encoder (``_json``) do the whole work by themselves: decoding goes through the hook's
``jsonmini``; encoding calls the C encoder with what ``json.dumps(obj, separators=(",",
":"))`` gives it. Without ``_json`` (not CPython) both fall back to :mod:`json`.
"""

from __future__ import annotations

from ..hooks.jsonmini import loads

__all__ = ["loads", "dumps"]


def _unsupported(obj):
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps(obj) -> str:
    """Compact JSON (no spaces), ASCII-only, as ``json.dumps(obj, separators=(",", ":"))``
    (NaN and infinities refused)."""
    try:
        import _json
    except ImportError:                              # not CPython
        import json
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    # markers=None: no cycle check (a parsed document has no cycles); no indent; keys
    # unsorted; nothing skipped; allow_nan=False.
    encode = _json.make_encoder(None, _unsupported, _json.encode_basestring_ascii, None, ":", ",",
                                False, False, False)
    return "".join(encode(obj, 0))
