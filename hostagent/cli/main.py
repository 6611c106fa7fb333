"""``hostagent`` entry point: registers the verbs and maps errors to exit codes.

Start-up stays lean: command modules import heavy dependencies (pynvml, yaml) inside the
functions that use them.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from ..errors import HostagentError
from . import cdi, devices, health, labels, mig, node, runtime, serve, sim

__all__ = ["main", "build_parser"]

COMMANDS = (devices, health, node, cdi, labels, mig, runtime, sim, serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hostagent", description="Node agent for GPU hosts.",
        epilog="Run 'hostagent COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"hostagent {__version__}")
    parser.add_argument("--simulate", metavar="DIR",
                        help="run against the simulated node in DIR (also: HOSTAGENT_SIMULATE)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def _os_error(e: OSError) -> str:
    """One line for a file-system error: the path first, as the other errors do."""
    text = e.strerror or str(e)
    if e.filename is not None:
        target = f" -> {e.filename2}" if e.filename2 is not None else ""
        text = f"{os.fsdecode(e.filename)}{target}: {text}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
