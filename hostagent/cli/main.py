"""``hostagent`` entry point: registers the verbs and maps errors to exit codes.

Start-up stays lean: only the command being run has its module imported and its parser
built (all of them for top-level help or an unknown word), and command modules import heavy
dependencies (pynvml, yaml) inside the functions that use them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import __version__
from ..errors import HostagentError

__all__ = ["main", "build_parser"]

# Each command is the module of the same name in this package ('-' spelled '_'), registered
# in this order.
COMMANDS = ("devices", "health", "node", "cdi", "labels", "mig", "runtime", "sim", "serve", "device-plugin")


def _command_word(argv: list[str]) -> str | None:
    """The command ``argv`` names, if it names one: its first word that is not a global
    option or the value of one."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if len(arg) > 2 and "--simulate".startswith(arg):
            i += 2            # --simulate DIR, or an abbreviation argparse accepts: --sim DIR
            continue
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
        if arg == "--":
            return None
        i += 1
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: only its command's subparser when it names one, none for
    ``--version``, all of them otherwise (top-level help, an unknown word)."""
    parser = argparse.ArgumentParser(
        prog="hostagent", description="Node agent for GPU hosts.",
        epilog="Run 'hostagent COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"hostagent {__version__}")
    parser.add_argument("--simulate", metavar="DIR",
                        help="run against the simulated node in DIR (also: HOSTAGENT_SIMULATE)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    word = _command_word(argv) if argv is not None else None
    names = (word,) if word else () if argv is not None and "--version" in argv else COMMANDS
    for name in names:
        importlib.import_module(f"{__package__}.{name.replace('-', '_')}").register(sub)
    return parser


def _os_error(e: OSError) -> str:
    """One line for a file-system error: the path first, as the other errors do."""
    text = e.strerror or str(e)
    if e.filename is not None:
        target = f" -> {e.filename2}" if e.filename2 is not None else ""
        text = f"{os.fsdecode(e.filename)}{target}: {text}"
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.simulate is not None and not args.simulate.strip():
        parser.error("--simulate needs a directory (an empty one would mean the real host)")
    import logging
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="hostagent: %(levelname)s: %(message)s")
    try:
        return args.run(args) or 0
    except HostagentError as e:
        print(f"hostagent: error: {e.message}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except OSError as e:
        # A file the command could not read or write: one line naming it. Other exceptions
        # are bugs and keep their traceback; -v shows this one's too.
        if args.verbose:
            import traceback
            traceback.print_exc()
        hint = "" if args.verbose else " (run with -v for details)"
        print(f"hostagent: error: {_os_error(e)}{hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
