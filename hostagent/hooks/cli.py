"""Command line of the hook program, parsed by hand.

argparse would cost more start-up time than the whole parse, and its error handling exits
with code 2 on anything unknown, which is the opposite of the policy here: a spec written
for a newer hook must not stop containers from starting on a node with an older one, so
unknown verbs and flags are reported as warnings and skipped. Known flags used wrongly are
a generator bug and fail loudly (exit 2) before anything is written.
"""

from .errors import HookError, UsageError

PROG = "hostagent-hook"
DEFAULT_LDCONFIG = "/sbin/ldconfig"
DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 600.0
MAX_PATH = 4096

# verb -> the flags it understands
VERBS = {
    "prepare": ("--link", "--device-link", "--folder", "--ldconfig-path", "--ldconfig-timeout", "--from-spec"),
    "create-symlinks": ("--link", "--device-link"),
    "update-ldcache": ("--folder", "--ldconfig-path", "--ldconfig-timeout"),
}
# A call with known flags and no verb at all means this one: it understands every flag.
DEFAULT_VERB = "prepare"
_ALL_FLAGS = frozenset(f for flags in VERBS.values() for f in flags)

USAGE = f"""usage: {PROG} [VERB] [FLAGS]   (run by the container engine; reads the OCI state on stdin)

The OCI hook of hostagent's CDI specs: at a container's start, as host root, it makes the
driver's library links in the container and refreshes its linker cache. The engine runs it
as the spec's createContainer hook, with the command line 'hostagent cdi generate' writes:
  python3 -I -S -c '...from hostagent.hooks.main import main...' VERB FLAGS
It works only when started isolated (python3 -I), which the installed {PROG} program
cannot be: that one answers --help and --version only. To run the hook by hand, as root
with an OCI state on stdin: python3 -I -m hostagent.hooks VERB ...

verbs:
  prepare          --link TARGET::LINK ... --device-link TARGET::LINK ... --folder DIR ...
                   links, then the linker cache (the verb when flags are given without one)
  create-symlinks  --link TARGET::LINK ... --device-link TARGET::LINK ...   links only
  update-ldcache   --folder DIR ... [--ldconfig-path PATH]    refresh the container's ld.so.cache

flags:
  --link TARGET::LINK         LINK is a container path; TARGET is stored as given (never followed)
  --device-link TARGET::LINK  the same, made only when the device node TARGET names (relative
                              to LINK's directory) is one of the container's linux.devices
  --folder DIR                container library directory to add to the linker cache
  --ldconfig-path PATH        the host's static ldconfig (default {DEFAULT_LDCONFIG}; PATH.real is
                              preferred when it exists); never a container binary
  --ldconfig-timeout SECS     wall-clock bound on ldconfig (default {DEFAULT_TIMEOUT:g})
  --from-spec PATH            also do the work PATH's own hostagent hook does (a host CDI spec
                              only root can write), as an OCI hooks directory entry runs it

Unknown verbs and flags are warned about and ignored (exit 0)."""


class Request:
    """What one invocation asks for. ``verb`` is None when there is nothing to do."""

    __slots__ = ("verb", "links", "device_links", "folders", "ldconfig_path", "ldconfig_timeout",
                 "from_spec", "warnings", "help")

    def __init__(self) -> None:
        self.verb: str | None = None
        self.links: list[tuple[str, str]] = []
        self.device_links: list[tuple[str, str]] = []
        self.folders: list[str] = []
        self.ldconfig_path = DEFAULT_LDCONFIG
        self.ldconfig_timeout = DEFAULT_TIMEOUT
        self.from_spec: str | None = None
        self.warnings: list[str] = []
        self.help = False


def parse(argv: list[str]) -> Request:
    """The verb is the first word that names one and is not a known flag's value. Flags
    before it (a newer spec's global options, with or without a value) are skipped with
    a warning; the verb and its flags still apply. A word no verb explains means a verb
    this hook does not know: nothing is done, whatever the flags say."""
    req = Request()
    req.help = any(a in ("-h", "--help") for a in argv)
    argv = [a for a in argv if a not in ("-h", "--help")]
    at, unknown = _find_verb(argv)
    if at is None and unknown is not None:
        req.warnings.append(f"unknown verb {unknown!r} ignored; this hook knows {', '.join(VERBS)}")
        return req
    if at is not None:
        verb, before, after = argv[at], argv[:at], argv[at + 1:]
    elif any(a.partition("=")[0] in _ALL_FLAGS for a in argv):
        verb, before, after = DEFAULT_VERB, [], argv
    else:
        verb, before, after = None, argv, []
    for arg in before:
        if arg.startswith("-"):
            req.warnings.append(f"unknown flag {arg.partition('=')[0]!r} before the verb ignored")
    if verb is not None:
        req.verb = verb
        _flags(req, after, VERBS[verb])
    return req


def add_spec_work(req: Request, args: list[str]) -> list[str]:
    """Add the links and folders of a spec hook's command line (``args``: its verb and
    flags) to ``req``; its own ldconfig settings and any --from-spec are not taken.
    Returns the warnings parsing it gave."""
    spec = parse(args)
    if spec.verb is None:
        raise HookError("the spec's hostagent hook names no verb this hook knows")
    for mine, theirs in ((req.links, spec.links), (req.device_links, spec.device_links),
                         (req.folders, spec.folders)):
        mine.extend(x for x in theirs if x not in mine)
    return [f"{req.from_spec}: {w}" for w in spec.warnings]


def _find_verb(argv: list[str]) -> tuple[int | None, str | None]:
    """(index of the verb, None), or (None, the first word that can only be an unknown
    verb), or (None, None) when there is no word at all."""
    first_word, i = None, 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("-"):
            if "=" not in arg and arg in _ALL_FLAGS:
                i += 1                               # its value, whatever it looks like
            continue
        if arg in VERBS:
            return i - 1, None
        if first_word is None:
            first_word = arg
    return None, first_word


def _flags(req: Request, args: list[str], known: tuple[str, ...]) -> None:
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            req.warnings.append(f"unexpected argument {arg!r} ignored")
            continue
        name, eq, value = arg.partition("=")
        if name not in known:
            # Skip its value too: no verb takes positional arguments, so a following word
            # that is not a flag can only belong to this flag.
            if not eq and i < len(args) and not args[i].startswith("-"):
                i += 1
            req.warnings.append(f"unknown flag {name!r} for {req.verb} ignored")
            continue
        if not eq:
            if i >= len(args):
                raise UsageError(f"{name} needs a value")
            value = args[i]
            i += 1
        _apply(req, name, value)


def _apply(req: Request, name: str, value: str) -> None:
    if "\0" in value or len(value) > MAX_PATH:
        raise UsageError(f"{name}: value is not a usable path")
    if name in ("--link", "--device-link"):
        link = check_link(name, value)
        links = req.links if name == "--link" else req.device_links
        if link not in links:
            links.append(link)
    elif name == "--folder":
        folder = check_folder(value)
        if folder not in req.folders:
            req.folders.append(folder)
    elif name == "--ldconfig-path":
        if not value.startswith("/"):
            raise UsageError(f"--ldconfig-path {value!r}: must be an absolute path on the host")
        req.ldconfig_path = value
    elif name == "--from-spec":
        if not value.startswith("/"):
            raise UsageError(f"--from-spec {value!r}: must be an absolute path on the host")
        req.from_spec = value
    elif name == "--ldconfig-timeout":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= MAX_TIMEOUT:          # also rejects nan
            raise UsageError(f"--ldconfig-timeout {value!r}: expected seconds in (0, {MAX_TIMEOUT:g}]")
        req.ldconfig_timeout = seconds


def check_link(name: str, value: str) -> tuple[str, str]:
    """(TARGET, LINK): exactly one ``::``, and a LINK that names an entry (inroot.split),
    so a bad link fails the call before any link is made."""
    from .inroot import split                  # _run imports it for every link anyway

    parts = value.split("::")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise UsageError(f"{name} {value!r}: expected TARGET::LINK")
    try:
        split(parts[1])
    except HookError as e:
        raise UsageError(f"{name} {value!r}: {e}") from None
    return parts[0], parts[1]


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
