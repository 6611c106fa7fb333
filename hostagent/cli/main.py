"""``hostagent`` entry point: registers the verbs and maps errors to exit codes.

Every command gets the global options, its own usage on a mistake and suggestions from
``parser``, and its errors reported by ``errors``: one line on stderr, a not-root hint where
permission was denied, detail with ``-v``.

Start-up stays lean: only the command being run has its module imported and its parser
built (all of them for top-level help or an unknown word), and command modules import heavy
dependencies (pynvml, yaml) inside the functions that use them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from ..errors import HostagentError, PermissionDenied
from .errors import os_error, report
from .parser import CommandParser, Parser, add_global_options, command_word, hoist_output

__all__ = ["main", "build_parser"]

# Each command is the module of the same name in this package ('-' spelled '_'), registered
# in this order; the simulator's is its own.
COMMANDS = ("devices", "topo", "health", "node", "driver", "cdi", "labels", "mig", "sharing", "allocations",
            "runtime", "sim", "serve", "device-plugin", "dra-plugin", "dra-webhook", "node-controller")
MODULES = {"sim": "hostagent.sim.cli"}


def simulator():
    """The simulator's platform, for a node named by --simulate (or HOSTAGENT_SIMULATE): the
    one place the command line reaches into the simulator (imported only then)."""
    from ..sim.platform import SIMULATOR
    return SIMULATOR


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: only its command's subparser when it names one, none for
    ``--version``, all of them otherwise (top-level help, an unknown word)."""
    parser = Parser(
        prog="hostagent", description="Node agent for GPU hosts.",
        epilog="Run 'hostagent COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"hostagent {__version__}")
    add_global_options(parser, top=True)
    parser.set_defaults(simulator=simulator)     # for common.host_from_args: --simulate's platform
    parser.add_argument("-o", "--output", metavar="FORMAT", dest="output_before_command",
                        help="output format of a command that has -o (table, json, yaml, ...): "
                             "before the command as well as after it")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=CommandParser)
    at = command_word(argv, COMMANDS) if argv is not None else None
    word = argv[at] if at is not None else None
    names = (word,) if word else () if argv is not None and "--version" in argv else COMMANDS
    for name in names:
        importlib.import_module(MODULES.get(name) or f"{__package__}.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(hoist_output(argv, command_word(argv, COMMANDS)))
    args.command_line = argv        # for a command's own advice (errors.rerun_as_root)
    for option in ("simulate", "host_root"):
        if getattr(args, option) is not None and not getattr(args, option).strip():
            parser.error(f"--{option.replace('_', '-')} needs a directory (an empty one would mean the real host)")
    import logging
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="hostagent: %(levelname)s: %(message)s")
    try:
        return args.run(args) or 0
    except HostagentError as e:
        report(e.message, e, argv, verbose=args.verbose, denied=isinstance(e, PermissionDenied))
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except OSError as e:
        # A file the command could not read or write: one line naming it. Other exceptions
        # are bugs and keep their traceback.
        report(os_error(e), e, argv, verbose=args.verbose)
        return 1


if __name__ == "__main__":
    sys.exit(main())
