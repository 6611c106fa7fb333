"""Files generated from the installed package itself, so they follow every command, option
and configuration key without edits: man pages and bash completion from each program's
argument parser (hostagent's page covers every command), and the commented configuration
file from the configuration schema.

Run by stage.py with the new environment's interpreter (``python -I docgen.py ...``). A
program documents itself through a ``build_parser()`` function in its entry point's module
that returns its ``argparse.ArgumentParser`` (hostagent, hostagentd); a program without one
(the hook and the runtime shim, which parse by hand to start fast) gets a page made from its
module's docstring.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
import textwrap
from pathlib import Path

SEE_ALSO_DOCS = "/usr/share/doc/hostagent"
# Each program's exit status, for the EXIT STATUS section.
EXIT_STATUS = {
    "hostagent": [("0", "success"), ("1", "a failure: one line on standard error says what, where and what to do"),
                  ("2", "a usage error: a wrong option or value, or a name that names nothing (a profile, "
                        "a GPU, a MIG config, an allocation)")],
    "hostagentd": [("0", "stopped on request (SIGTERM); with --check: the daemon answers"),
                   ("1", "it could not start (the log's last line says why); with --check: no daemon answers"),
                   ("2", "a usage error in its options")],
}
DEFAULT_EXIT_STATUS = [("0", "success"), ("non-zero", "a failure: the line on standard error says why")]
# The NAME line of programs documented from their docstring, whose first sentence says how
# they start rather than what they are.
SUMMARIES = {"hostagent-hook": "the OCI hook hostagent's CDI specs run when a GPU container starts",
             "hostagent-runtime": "the OCI runtime shim that gives CDI devices to engines without CDI"}


def roff(text: str) -> str:
    return text.replace("\\", "\\\\").replace("-", "\\-")


class Pages:
    def __init__(self, dest: Path, version: str, section_8: set[str]):
        self.dest, self.version, self.section_8 = dest, version, section_8
        epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or None
        when = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc) if epoch else datetime.datetime.now()
        self.date = when.strftime("%Y-%m-%d")
        self.written: list[str] = []      # "name(section)"

    def section(self, name: str) -> str:
        return "8" if name in self.section_8 else "1"

    def write(self, name: str, text: str) -> None:
        section = self.section(name)
        path = self.dest / f"usr/share/man/man{section}/{name}.{section}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def from_parser(self, name: str, parser: argparse.ArgumentParser, *, tail: str = "") -> None:
        from argparse_manpage.manpage import Manpage
        page = Manpage(parser, _data={"version": self.version, "project_name": "hostagent",
                                      "manual_section": self.section(name), "description": summary(parser.description),
                                      "manual_title": "hostagent manual", "date": self.date})
        self.write(name, str(page) + exit_status(name) + tail)

    def from_docstring(self, name: str, module) -> None:
        doc = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
        section = self.section(name)
        text = (f'.TH {roff(name.upper())} "{section}" "{self.date}" "hostagent {self.version}" "hostagent manual"\n'
                f".SH NAME\n{roff(name)} \\- {roff(SUMMARIES.get(name) or summary(doc))}\n.SH SYNOPSIS\n.B {roff(name)}\n[ARGUMENTS]\n"
                f".SH DESCRIPTION\n{roff(doc)}\n{exit_status(name)}")
        self.write(name, text)
        self.written.append(f"{name}({section})")


def summary(text: str | None) -> str:
    """A description's first sentence, without its full stop: the NAME line's (what whatis
    and apropos show)."""
    sentence = " ".join((text or "").split()).split(". ")[0]
    return sentence.rstrip(".").replace("``", "")


def exit_status(name: str) -> str:
    rows = "".join(f".TP\n.B {roff(code)}\n{roff(what)}\n" for code, what in EXIT_STATUS.get(name, DEFAULT_EXIT_STATUS))
    return f".SH EXIT STATUS\n{rows}"


def see_also(names: list[str]) -> str:
    refs = ",\n".join(f".BR {roff(n.split('(')[0])} ({n.split('(')[1]}" for n in names)
    return (f"\n.SH SEE ALSO\n{refs}\n.PP\nThe documentation in\n.IR {SEE_ALSO_DOCS} .\n"
            f".SH FILES\n.TP\n.I /etc/hostagent/config.yaml\nconfiguration, every key documented in it\n"
            f".TP\n.I /run/hostagent/hostagent.sock\nthe agent's local API\n")


def document(programs: dict[str, str], pages: Pages) -> None:
    import shtab
    parsers = {}
    for name, entry in programs.items():
        module = importlib.import_module(entry.split(":")[0])
        build = getattr(module, "build_parser", None)
        if callable(build):
            parsers[name] = build()
        else:
            pages.from_docstring(name, module)
    every = sorted([f"{n}({pages.section(n)})" for n in parsers] + pages.written)
    for name, parser in parsers.items():
        pages.from_parser(name, parser, tail=see_also([n for n in every if not n.startswith(f"{name}(")]))
    for name, parser in parsers.items():
        out = pages.dest / "usr/share/bash-completion/completions" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(shtab.complete(parser, shell="bash"))


def config_template() -> str:
    """Every section and key of the configuration schema, commented out, with its default."""
    import yaml
    from hostagent.config import schema
    sch = schema()

    def wrap(text: str, indent: str) -> str:
        return "".join(f"{indent}# {line}\n" for line in textwrap.wrap(" ".join(text.split()), 84))
    out = [f"# /etc/hostagent/config.yaml\n#\n{wrap(sch.get('description', ''), '')}"
           "#\n# Uncomment a key to change it; 'systemctl reload hostagent' applies most keys.\n"]
    for section, sub in sch["properties"].items():
        out.append(f"\n{wrap(sub.get('description', section), '')}# {section}:\n")
        for key, prop in sub.get("properties", {}).items():
            default = yaml.safe_dump(prop.get("default"), default_flow_style=True, width=1 << 16).strip()
            default = default.removesuffix("\n...").removesuffix("...").strip()
            out.append(wrap(prop.get("description", ""), "#   ") + f"#   {key}: {default}\n")
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", required=True, help="where argparse-manpage and shtab are installed")
    ap.add_argument("--dest", required=True, type=Path)
    ap.add_argument("--version", required=True)
    ap.add_argument("--section-8", default="")
    ap.add_argument("--program", action="append", default=[], help="NAME=MODULE:FUNCTION")
    args = ap.parse_args()
    sys.path.append(args.tools)
    programs = dict(p.split("=", 1) for p in args.program)
    document(programs, Pages(args.dest, args.version, set(filter(None, args.section_8.split(",")))))
    config = args.dest / "etc/hostagent/config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(config_template())
    return 0


if __name__ == "__main__":
    sys.exit(main())
