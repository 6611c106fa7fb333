"""NVML's C functions for the queries the sampler makes of every device at every interval
(memory, field values, GPM), with answer structures laid out once.

pynvml's wrappers build a new answer structure at each call, and its structures check every
attribute read and write (``_PrintableStructure``); for memory and field values that cost
as much as the rest of the agent's work on the answer. The sampler calls the same C
functions from pynvml's function table (the library pynvml loaded, the simulator's
included) with structures of pynvml's own layouts as plain ctypes ones, and reads their
return codes as pynvml's wrappers do (``pynvml.NVMLError(code)`` names them).
"""

from __future__ import annotations

import ctypes

import pynvml as N

__all__ = ["call", "plain", "MemoryV2", "FieldValues"]


def call(name: str, *args) -> int:
    """The C function ``name`` on ``args``: its nvmlReturn_t (FUNCTION_NOT_FOUND where the
    library has none). Looked up at each call in pynvml's table, which is emptied when
    another library is loaded."""
    try:
        function = N._nvmlGetFunctionPointer(name)
    except N.NVMLError as e:
        return e.value
    return function(*args)


def plain(struct):
    """pynvml's structure ``struct`` as a plain ctypes structure: the same fields, unchecked."""
    return type(struct.__name__, (ctypes.Structure,), {"_fields_": struct._fields_})


MemoryV2 = plain(N.c_nvmlMemory_v2_t)
_FieldValue = plain(N.c_nvmlFieldValue_t)


class FieldValues:
    """A request of ``nvmlDeviceGetFieldValues`` for fixed (fieldId, scopeId) pairs:
    ``new()`` gives a fresh copy to fill, as pynvml's wrapper builds one per call."""

    def __init__(self, fields):
        self.fields = tuple(fields)
        request = (_FieldValue * len(self.fields))()
        for entry, (field, scope) in zip(request, self.fields):
            entry.fieldId, entry.scopeId = field, scope
        self._type, self._request = type(request), bytes(request)

    def new(self):
        return self._type.from_buffer_copy(self._request)
