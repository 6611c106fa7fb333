"""The host's own ``libnvidia-ml.so.1`` beneath pynvml, when the host is not this machine's ``/``.

pynvml loads ``libnvidia-ml.so.1`` by name, from this machine's library path: right on a
host, wrong in a container that mounts the host at ``/host`` (the image has no driver) or
with the driver in another root (the GPU operator's ``/run/nvidia/driver``). There the
library is found in the driver root's library folders, its links followed within that
root, and loaded as pynvml's library object, as the simulator installs its own
(``sim.fakenvml``): pynvml's marshalling and error handling stay in the path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml as N

from ..hostroot import LIBRARY_DIRS, HostRoot

__all__ = ["library_path", "load_host_library", "own_library"]

SONAME = "libnvidia-ml.so.1"


def own_library(host: HostRoot) -> bool:
    """Whether this host's NVML is not the one pynvml finds by itself."""
    return host.root != host.root.parent or host.driver_root is not None


def library_path(host: HostRoot) -> Path | None:
    """Where the host's libnvidia-ml.so.1 is on this machine (its links followed within
    the root), or None."""
    for rel in LIBRARY_DIRS:
        path = host.resolve(host.driver(rel) / SONAME)
        if path.is_file():
            return path
    return None


def load_host_library(host: HostRoot) -> Path:
    """Put the host's library beneath pynvml (once: kept while it is the same file).
    Raises NVMLError(LIBRARY_NOT_FOUND) as pynvml would, when there is none or it cannot
    be loaded."""
    path = library_path(host)
    with N.libLoadLock:
        if path is not None and getattr(N.nvmlLib, "_name", None) == str(path):
            return path
        lib = None
        if path is not None:
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                lib = None
        if lib is None:
            raise N.NVMLError(N.NVML_ERROR_LIBRARY_NOT_FOUND)
        N.nvmlLib = lib
        N._nvmlGetFunctionPointer_cache.clear()
    return path
