"""The command line's parsers: what every command gets without asking.

- The global options (``--simulate``, ``--host-root``, ``--driver-root``, ``-v``) are
  accepted after the command and its verb as well as before them: every command's parser
  is a ``CommandParser``, which adds them (``add_subparsers`` hands its class down to the
  verbs' parsers). Given after the command they win; given before, they stand unless
  repeated after.
- ``-o``/``--output`` before the command is moved behind it (``hoist_output``), so the
  command's own option takes it, with the command's own choices and error.
- A mistake is reported by the parser of the command it was made in (argparse leaves an
  unknown option to the top level's) as one line, like every other error: the command, the
  option and what was wrong with it, and where the options are listed (``--help``); a
  mistyped command, verb, choice or option gets a suggestion.
"""

from __future__ import annotations

import argparse
import re

from ..suggest import closest, did_you_mean

__all__ = ["Parser", "CommandParser", "OneLineErrors", "add_global_options", "command_word", "hoist_output"]

# Top-level options that take a value, with the prefixes argparse accepts for them.
_VALUED = ("--simulate", "--host-root", "--driver-root", "--output")


def add_root_options(group, **kw) -> None:
    """Which host the command works on (``hostagent`` and ``hostagentd`` alike)."""
    group.add_argument("--simulate", metavar="DIR",
                       help="run against the simulated node in DIR (also: HOSTAGENT_SIMULATE)", **kw)
    group.add_argument("--host-root", metavar="DIR",
                       help="the host's / is mounted at DIR, as in a container (also: HOSTAGENT_HOST_ROOT); "
                            "files written for the host name host paths", **kw)
    group.add_argument("--driver-root", metavar="DIR",
                       help="where the NVIDIA driver's files are, such as /run/nvidia/driver "
                            "(also: HOSTAGENT_DRIVER_ROOT; default: the host root)", **kw)


def add_global_options(parser, *, top: bool) -> None:
    group = parser.add_argument_group("global options (before or after the command)")
    kw = {} if top else {"default": argparse.SUPPRESS}
    add_root_options(group, **kw)
    group.add_argument("-v", "--verbose", action="store_true",
                       help="log debug detail to stderr, and say more about an error", **kw)


class OneLineErrors:
    """A mistake on the command line in one line, with no usage block:
    ``PROG: error: argument --sm: ... (see PROG --help)``; exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{_suggestion(self, message)} (see {self.prog} --help)\n")


class Parser(OneLineErrors, argparse.ArgumentParser):
    pass


class CommandParser(Parser):
    """A command's (or a verb's) parser."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        add_global_options(self, top=False)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        return did_you_mean(choice.group(1), re.findall(r"[^\s',]+", choice.group(2)))
    unknown = re.match(r"unrecognized arguments: (\S+)", message)
    if unknown and unknown.group(1).startswith("-"):
        # Compared without the dashes every long option has.
        word = unknown.group(1).split("=", 1)[0].lstrip("-")
        match = closest(word, [o[2:] for o in parser._option_string_actions if o.startswith("--")])
        return f" (did you mean '--{match}'?)" if match else ""
    return ""


def _valued(arg: str) -> str | None:
    """The valued top-level option ``arg`` names without ``=VALUE`` (an abbreviation
    included), or None."""
    if arg.startswith("--") and "=" not in arg and len(arg) > 2:
        return next((o for o in _VALUED if o.startswith(arg)), None)
    return "--output" if arg == "-o" else None


def _output_with_value(arg: str) -> bool:
    """``-oFORMAT`` or ``--output=FORMAT`` (or an abbreviation: ``--out=FORMAT``)."""
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        return "=" in arg and len(name) > 2 and "--output".startswith(name)
    return arg.startswith("-o") and len(arg) > 2


def command_word(argv: list[str], commands) -> int | None:
    """The index of the command word in ``argv``: its first word that is not a global
    option or the value of one; None without one (or when that word names no command)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return None
        if _valued(arg):
            i += 2
            continue
        if not arg.startswith("-"):
            return i if arg in commands else None
        i += 1
    return None


def hoist_output(argv: list[str], at: int | None) -> list[str]:
    """``argv`` with an ``-o FORMAT`` given before the command (``at``) moved behind it
    (before a ``--``), where the command's own ``-o`` takes it."""
    if at is None:
        return argv
    before, moved, i = [], [], 0
    while i < at:
        arg = argv[i]
        if _valued(arg) == "--output":
            moved += argv[i:i + 2]
            i += 2
        elif _output_with_value(arg):
            moved.append(arg)
            i += 1
        else:
            before.append(arg)
            i += 1
    if not moved:
        return argv
    rest = argv[at:]
    end = rest.index("--") if "--" in rest else len(rest)
    return before + rest[:end] + moved + rest[end:]
