"""How the fake NVML's C functions are declared and how they write their answers.

``nvml(*argtypes)`` registers a function (its first argument the library) as the C function
of the same name; ``FakeNvmlLibrary`` binds every registered one. Modules that add calls
(``faketopology``) register here, so the library imports them, never the other way round.
"""

from __future__ import annotations

import ctypes
from ctypes import c_uint, c_void_p

import pynvml as N

from .node import SimNvmlError

__all__ = ["FUNCS", "P", "nvml", "put", "put_str", "struct", "sized", "normal_bus_id"]

FUNCS: dict[str, tuple[tuple, object]] = {}
P = c_void_p   # every pointer and handle is passed as an address


def nvml(*argtypes):
    """Register a function as the C function of the same name with these argument types."""
    def register(fn):
        FUNCS[fn.__name__] = (argtypes, fn)
        return fn
    return register


def put(ptr: int, ctype, value) -> None:
    ctype.from_address(ptr).value = value


def put_str(buf: int, length: int, text: str) -> None:
    data = text.encode()
    if len(data) + 1 > length:
        raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_SIZE, "buffer too small")
    ctypes.memmove(buf, data + b"\0", len(data) + 1)


def struct(ptr: int, ctype):
    if not ptr:
        raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, "NULL pointer")
    return ctype.from_address(ptr)


def sized(count_ptr: int, array: int, count: int, what: str) -> bool:
    """NVML's two-call protocol for ``count`` items: the count is put; False where the array
    is NULL (only the count was asked), INSUFFICIENT_SIZE where it is too short."""
    have = c_uint.from_address(count_ptr).value
    put(count_ptr, c_uint, count)
    if not array:
        return False
    if have < count:
        raise SimNvmlError(N.NVML_ERROR_INSUFFICIENT_SIZE, f"{what} buffer too small")
    return True


def normal_bus_id(bus_id: str) -> str:
    """NVML's form: 8-digit domain, upper-case hex ("00000000:07:00.0")."""
    parts = bus_id.strip().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    domain, bus, rest = parts
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"
