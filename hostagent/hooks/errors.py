"""The hook's one error type: a one-line message for the engine's log, and an exit code."""


class HookError(Exception):
    """Refuse or fail: ``str(err)`` is the whole message the user sees."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class UsageError(HookError):
    """A known flag used wrongly (a generator bug): exit 2, like the CLI."""

    def __init__(self, message: str):
        super().__init__(message, code=2)
