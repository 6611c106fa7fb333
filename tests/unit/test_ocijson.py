"""ocijson.dumps writes what json.dumps(obj, separators=(",", ":")) writes, with or without _json."""

import json
import sys

import pytest

from hostagent.runtime import ocijson

VALUE = {"ociVersion": "1.0.2", "annotations": {"note": "GPU ünïcødé ✓ \U0001f600 \"quoted\"\n\t\\"},
         "linux": {"devices": [{"major": 195, "minor": 0, "fileMode": 438}],
                   "resources": {"cpu": {"shares": 1.5, "quota": -2.25e-7, "big": 1e300}}},
         "process": {"env": ["A=1", "B="], "terminal": False, "user": None}, "empty": [{}, []]}


def test_dumps_matches_json():
    expected = json.dumps(VALUE, separators=(",", ":"))
    assert ocijson.dumps(VALUE) == expected
    assert ocijson.dumps(VALUE).isascii()
    assert ocijson.loads(ocijson.dumps(VALUE).encode()) == VALUE


def test_dumps_without_the_c_codec_falls_back_to_json(monkeypatch):
    calls, real = [], json.dumps

    def spy(obj, **kwargs):
        calls.append(obj)
        return real(obj, **kwargs)
    monkeypatch.setattr(json, "dumps", spy)
    monkeypatch.setitem(sys.modules, "_json", None)       # import _json now raises ImportError
    assert ocijson.dumps(VALUE) == real(VALUE, separators=(",", ":"))
    assert calls == [VALUE]                               # the fallback did the work
    with pytest.raises(ValueError):
        ocijson.dumps({"x": float("nan")})


def test_dumps_refuses_nan_and_infinity():
    for bad in (float("nan"), float("inf"), [float("-inf")]):
        with pytest.raises(ValueError):
            ocijson.dumps({"x": bad})
