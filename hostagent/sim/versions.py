"""The driver versions a simulated node holds now, read from its files as the real tools
find them: the user-space libraries (the file ``libnvidia-ml.so.1`` points to), the loaded
kernel module (``/sys/module/nvidia/version``) and the CUDA driver version that comes with
the libraries. A simulated install or upgrade changes those files, so the fake NVML and
``nvidia-smi`` both answer with what the node holds, never with what it was created with.
"""

from __future__ import annotations

import os

__all__ = ["library_version", "module_version", "cuda_version"]


def library_version(root) -> str | None:
    """The version in the name of the file libnvidia-ml.so.1 points to; None without one."""
    from .driverlibs import LIB_DIR
    try:
        target = os.readlink(os.path.join(root, LIB_DIR, "libnvidia-ml.so.1"))
    except OSError:
        return None
    return os.path.basename(target).partition("libnvidia-ml.so.")[2] or None


def module_version(root, default: str) -> str:
    """The loaded nvidia module's version, as /sys/module/nvidia/version says."""
    try:
        with open(os.path.join(root, "sys/module/nvidia/version")) as f:
            return f.read().strip() or default
    except OSError:
        return default


def cuda_version(root, facts) -> int:
    """The CUDA driver version of the user-space libraries (libcuda ships with them): the
    profile's for the driver the node was made with, else the one of the installed branch."""
    from ..errors import HostagentError
    from .catalog import cuda_version as of_branch
    library = library_version(root)
    if library is None or library == facts.driver_version:
        return facts.cuda_driver_version
    try:
        return of_branch(library)
    except HostagentError:            # not a driver version the catalogue knows
        return facts.cuda_driver_version
