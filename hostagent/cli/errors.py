"""How every command reports an error: one line on stderr saying what, where and what to do.

A user who is not root and was refused something (a file, the node lock, the daemon's
socket or an API call) is told to run the command as root, with the command line to use;
``-v`` adds what the system said, never a traceback.
"""

from __future__ import annotations

import errno
import os
import sys

__all__ = ["os_error", "report", "rerun_as_root"]

def os_error(e: OSError) -> str:
    """One line for a file-system error: the path first, as the other errors do."""
    text = e.strerror or str(e)
    if e.filename is not None:
        target = f" -> {e.filename2}" if e.filename2 is not None else ""
        text = f"{os.fsdecode(e.filename)}{target}: {text}"
    return text


def _chain(error: BaseException):
    """``error`` and what it was raised from (``from None`` hides a cause from tracebacks,
    not from here)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def rerun_as_root(argv: list[str]) -> str:
    """The command line that runs this command again as root."""
    import shlex
    import shutil
    program = sys.argv[0] if os.path.basename(sys.argv[0]) == "hostagent" else "hostagent"
    if shutil.which("hostagent") == program:
        program = "hostagent"           # on PATH: the short form is the same program
    return "sudo " + shlex.join([program, *argv])


def report(message: str, error: BaseException, argv: list[str], *, verbose: bool, denied: bool = False) -> None:
    """Print ``message`` for ``error`` (raised by the command ``argv``) on stderr."""
    from ..errors import permission_refused
    if os.geteuid() != 0 and (denied or permission_refused(error)):
        message += f"; run it as root: {rerun_as_root(argv)}"
    elif isinstance(error, OSError) and not verbose:
        message += " (run with -v for details)"
    print(f"hostagent: error: {message}", file=sys.stderr)
    if verbose:
        for line in _detail(error):
            print(f"hostagent: detail: {line}", file=sys.stderr)


def _detail(error: BaseException) -> list[str]:
    out = []
    for e in _chain(error):
        text = f"{type(e).__name__}: {e}"
        if isinstance(e, OSError) and e.errno in errno.errorcode:
            text += f" [{errno.errorcode[e.errno]}]"
        details = getattr(e, "details", None)
        if details:
            text += " " + ", ".join(f"{k}={v}" for k, v in details.items())
        out.append(text)
    out.append(f"as uid {os.geteuid()}, gid {os.getegid()}, groups {sorted(os.getgroups())}")
    return out
