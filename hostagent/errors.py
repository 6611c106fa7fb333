"""The one error hierarchy of hostagent.

    HostagentError              what went wrong, where, and what to do
    ├── UsageError              bad command-line or request input (exit 2)
    ├── NotFoundError           a device, file or object that does not exist
    │   └── UnknownName         a name the caller gave that names nothing (exit 2)
    ├── ConfigError             an invalid configuration or data file
    ├── StateError              the node is not in a state that allows the operation
    ├── ConflictError           the request conflicts with existing state (an allocation, a busy device)
    ├── PermissionDenied        the caller may not do this
    ├── UnavailableError        the service cannot answer now (starting, overloaded, NVML down)
    └── NvmlError               a failed NVML call
        ├── NvmlLibraryMissing  libnvidia-ml.so.1 cannot be loaded
        └── DriverNotLoaded     the library loads but the kernel driver is absent

The CLI maps these to one-line messages and exit codes; the API maps them to
JSON errors using the stable ``code``.
"""

from __future__ import annotations

__all__ = [
    "HostagentError",
    "UsageError",
    "NotFoundError",
    "UnknownName",
    "ConfigError",
    "StateError",
    "ConflictError",
    "PermissionDenied",
    "UnavailableError",
    "NvmlError",
    "NvmlLibraryMissing",
    "DriverNotLoaded",
    "permission_refused",
]

NVML_NO_PERMISSION = 4          # nvml.h: NVML_ERROR_NO_PERMISSION


class HostagentError(Exception):
    code = "error"
    exit_code = 1

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None, **details):
        self.what = what
        self.where = where
        self.hint = hint
        self.details = details
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        return f"{text} ({self.hint})" if self.hint else text

    def to_dict(self) -> dict:
        out = {"code": self.code, "message": self.message}
        if self.details:
            out["details"] = self.details
        return out


class UsageError(HostagentError):
    code = "invalid_argument"
    exit_code = 2


class NotFoundError(HostagentError):
    code = "not_found"


class UnknownName(NotFoundError):
    """A name the caller gave (a MIG config, a device, an allocation, a fault) that names
    nothing: a usage error on the command line (exit 2); the API's code stays not_found,
    with the name in its details."""
    exit_code = 2

    def __init__(self, what: str, *, name, **kw):
        super().__init__(what, name=str(name), **kw)


class ConfigError(HostagentError):
    code = "invalid_config"


class StateError(HostagentError):
    code = "invalid_state"


class ConflictError(HostagentError):
    code = "conflict"


class PermissionDenied(HostagentError):
    code = "forbidden"


class UnavailableError(HostagentError):
    code = "unavailable"


class NvmlError(HostagentError):
    code = "nvml_error"

    def __init__(self, what: str, *, nvml_code: int | None = None, **kw):
        super().__init__(what, **kw)
        self.nvml_code = nvml_code


class NvmlLibraryMissing(NvmlError):
    code = "nvml_missing"


class DriverNotLoaded(NvmlError):
    code = "driver_not_loaded"


def permission_refused(error: BaseException) -> bool:
    """Whether ``error``, or what it was raised from, is a refusal for want of privilege:
    the system's (EACCES, EPERM) or NVML's (NO_PERMISSION)."""
    import errno
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM):
            return True
        if isinstance(error, NvmlError) and error.nvml_code == NVML_NO_PERMISSION:
            return True
        error = error.__cause__ or error.__context__
    return False
