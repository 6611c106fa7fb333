"""``prepare --from-spec PATH``: the work a node's CDI spec gives its own hostagent hook
(library links, device links, linker cache folders), for engines that run the hook from an
OCI hooks directory (hooks/50-hostagent.json) instead of from a CDI spec.

The spec is a host file the hook trusts as it trusts its own arguments, so it must be a
regular file (no symlink followed) that only root can write.
"""

import posix

from .errors import HookError
from .jsonmini import loads

__all__ = ["hook_args", "MAX_SPEC"]

MAX_SPEC = 16 << 20
ENTRY = "hostagent.hooks.main"


def _read(path: str) -> bytes:
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK)
    except OSError as e:
        raise HookError(f"--from-spec {path}: {e.strerror}") from None
    try:
        st = posix.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            raise HookError(f"--from-spec {path}: not a regular file")
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise HookError(f"--from-spec {path}: must be owned by root and writable by no one else "
                            f"(owner uid {st.st_uid}, mode {st.st_mode & 0o7777:04o})")
        data = b""
        while len(data) <= MAX_SPEC:
            chunk = posix.read(fd, MAX_SPEC + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        posix.close(fd)
    if len(data) > MAX_SPEC:
        raise HookError(f"--from-spec {path}: larger than {MAX_SPEC >> 20} MiB")
    return data


def hook_args(path: str) -> list[str]:
    """The verb and flags of the spec's hostagent hook: what follows its ``-c`` program."""
    try:
        spec = loads(_read(path))
    except ValueError as e:
        raise HookError(f"--from-spec {path}: not JSON ({e})") from None
    edits = spec.get("containerEdits") if isinstance(spec, dict) else None
    hooks = edits.get("hooks") if isinstance(edits, dict) else None
    for hook in hooks if isinstance(hooks, list) else ():
        args = hook.get("args") if isinstance(hook, dict) else None
        if isinstance(args, list) and all(isinstance(a, str) for a in args) and "-c" in args:
            at = args.index("-c") + 1
            if at < len(args) and ENTRY in args[at]:
                return args[at + 1:]
    raise HookError(f"--from-spec {path}: the spec has no hostagent hook (generate it with 'hostagent cdi refresh')")
