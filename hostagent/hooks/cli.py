"""Command line of the hook program, parsed by hand.

argparse would cost more start-up time than the whole parse, and its error handling exits
with code 2 on anything unknown, which is the opposite of the policy here: a spec written
for a newer hook must not stop containers from starting on a node with an older one, so
unknown verbs and flags are reported as warnings and skipped. Known flags used wrongly are
a generator bug and fail loudly (exit 2) before anything is written.
"""

from __future__ import annotations

from .errors import UsageError

PROG = "hostagent-hook"
DEFAULT_LDCONFIG = "/sbin/ldconfig"
DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 600.0
MAX_PATH = 4096

# verb -> the flags it understands
VERBS = {
    "prepare": ("--link", "--folder", "--ldconfig-path", "--ldconfig-timeout"),
    "create-symlinks": ("--link",),
    "update-ldcache": ("--folder", "--ldconfig-path", "--ldconfig-timeout"),
}
_REPEATED = ("--link", "--folder")

USAGE = f"""usage: {PROG} VERB [FLAGS]   (run by the container engine; reads the OCI state on stdin)

verbs:
  prepare          --link TARGET::LINK ... --folder DIR ...   links, then the linker cache
  create-symlinks  --link TARGET::LINK ...                    create links in the container
  update-ldcache   --folder DIR ... [--ldconfig-path PATH]    refresh the container's ld.so.cache

flags:
  --link TARGET::LINK      LINK is a container path; TARGET is stored as given (never followed)
  --folder DIR             container library directory to add to the linker cache
  --ldconfig-path PATH     the host's static ldconfig (default {DEFAULT_LDCONFIG}; PATH.real is
                           preferred when it exists); never a container binary
  --ldconfig-timeout SECS  wall-clock bound on ldconfig (default {DEFAULT_TIMEOUT:g})

Unknown verbs and flags are warned about and ignored (exit 0)."""


class Request:
    """What one invocation asks for. ``verb`` is None when there is nothing to do."""

    __slots__ = ("verb", "links", "folders", "ldconfig_path", "ldconfig_timeout", "warnings", "help")

    def __init__(self) -> None:
        self.verb: str | None = None
        self.links: list[tuple[str, str]] = []
        self.folders: list[str] = []
        self.ldconfig_path = DEFAULT_LDCONFIG
        self.ldconfig_timeout = DEFAULT_TIMEOUT
        self.warnings: list[str] = []
        self.help = False


def parse(argv: list[str]) -> Request:
    req = Request()
    known: tuple[str, ...] = ()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg in ("-h", "--help"):
            req.help = True
            continue
        if not arg.startswith("-"):
            if req.verb is None and not known:
                if arg in VERBS:
                    req.verb, known = arg, VERBS[arg]
                else:
                    req.warnings.append(f"unknown verb {arg!r} ignored; this hook knows {', '.join(VERBS)}")
                    return req                       # nothing we understand follows
            else:
                req.warnings.append(f"unexpected argument {arg!r} ignored")
            continue
        name, eq, value = arg.partition("=")
        if name not in known:
            # Skip its value too: no verb takes positional arguments, so a following word
            # that is not a flag can only belong to this flag.
            if not eq and i < len(argv) and not argv[i].startswith("-") and req.verb is not None:
                i += 1
            where = f"for {req.verb}" if req.verb else "before the verb"
            req.warnings.append(f"unknown flag {name!r} {where} ignored")
            continue
        if not eq:
            if i >= len(argv):
                raise UsageError(f"{name} needs a value")
            value = argv[i]
            i += 1
        _apply(req, name, value)
    return req


def _apply(req: Request, name: str, value: str) -> None:
    if "\0" in value or len(value) > MAX_PATH:
        raise UsageError(f"{name}: value is not a usable path")
    if name == "--link":
        parts = value.split("::")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise UsageError(f"--link {value!r}: expected TARGET::LINK")
        if (parts[0], parts[1]) not in req.links:
            req.links.append((parts[0], parts[1]))
    elif name == "--folder":
        folder = check_folder(value)
        if folder not in req.folders:
            req.folders.append(folder)
    elif name == "--ldconfig-path":
        if not value.startswith("/"):
            raise UsageError(f"--ldconfig-path {value!r}: must be an absolute path on the host")
        req.ldconfig_path = value
    elif name == "--ldconfig-timeout":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= MAX_TIMEOUT:          # also rejects nan
            raise UsageError(f"--ldconfig-timeout {value!r}: expected seconds in (0, {MAX_TIMEOUT:g}]")
        req.ldconfig_timeout = seconds


def check_folder(value: str) -> str:
    """A folder becomes one line of ld.so.conf and an ldconfig argument: it must be an
    absolute path that cannot be read as anything else there (no newline, no comment,
    no ``=TYPE`` suffix, no surrounding blanks)."""
    if not value.startswith("/"):
        raise UsageError(f"--folder {value!r}: must be an absolute container path")
    if any(c in value for c in "#=") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise UsageError(f"--folder {value!r}: contains characters ld.so.conf cannot hold")
    if value != value.strip():
        raise UsageError(f"--folder {value!r}: leading or trailing blanks")
    folder = "/" + "/".join(p for p in value.split("/") if p and p != ".")
    return folder
